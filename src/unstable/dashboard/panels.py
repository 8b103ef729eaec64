"""The dashboard's panels: each turns a run's rows (as read from `metrics.jsonl`) into one Rich panel."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from unstable.dashboard.system import Gauge
from unstable.tracking import keys
from unstable.tracking.history import (
    agent_label,
    busiest_agents,
    eval_window_rows,
    final_row,
    latest_value,
    series,
)

SPARK_CHARS = "▁▂▃▄▅▆▇█"
HEATMAP_AGENTS = 6  # the match heatmap shows the agents with the most games, up to this many


def sparkline(values: list[float], width: int = 40) -> str:
    """The last `width` values as a line of block characters, lowest to highest."""
    values = values[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARK_CHARS[round((v - low) / span * (len(SPARK_CHARS) - 1))] for v in values)


def trend(values: list[float], width: int = 40, spec: str = ".3g", style: str = "green") -> Text:
    """A sparkline of `values` followed by their range, so the height of the blocks has a scale."""
    if not values:
        return Text("-", style="dim")
    line = Text(sparkline(values, width), style=style)
    recent = values[-width:]
    line.append(f"  {min(recent):{spec}} … {max(recent):{spec}}", style="dim")
    return line


def bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar filled to `fraction` (clipped to [0, 1])."""
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def interval_bar(low: float, mid: float, high: float, width: int = 20) -> Text:
    """A [0, 1] axis with the interval `low`..`high` drawn as a line and the estimate `mid` as a dot."""
    cells = ["·"] * width
    for i in range(_cell(low, width), _cell(high, width) + 1):
        cells[i] = "─"
    cells[_cell(mid, width)] = "●"
    return Text.assemble(("0 ", "dim"), ("".join(cells), "cyan"), (" 1", "dim"))


def _cell(fraction: float, width: int) -> int:
    """The cell of a `width`-cell [0, 1] axis that `fraction` falls in."""
    return min(width - 1, max(0, round(fraction * (width - 1))))


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def _metric_table(rows: list[dict[str, Any]], entries: tuple[tuple[str, str, str], ...]) -> Table:
    """A two-column table of `(label, key, format)` entries at their newest values."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column(justify="right")
    for label, key, spec in entries:
        table.add_row(label, _fmt(latest_value(rows, key), spec))
    return table


def header(run_name: str, rows: list[dict[str, Any]], total_steps: int | None, live: bool) -> Panel:
    """Run name, learner progress, elapsed time and whether the run is still writing."""
    step = latest_value(rows, keys.STEP, 0)
    of = f"/{total_steps}" if total_steps else ""
    state = "[green]finished[/]" if final_row(rows) else "[yellow]running[/]" if live else "[dim]no new rows[/]"
    progress = f"  {bar(step / total_steps, 30)}" if total_steps else ""
    text = (
        f"[bold]{run_name}[/]   learner step [bold]{step}{of}[/]{progress}   "
        f"elapsed {_fmt(latest_value(rows, keys.TIME, 0.0), '.0f')}s   {state}"
    )
    return Panel(Text.from_markup(text), title="unstable-baselines", border_style="blue")


def system(gauges: list[Gauge]) -> Panel:
    """This machine's GPUs (or CPU and memory) as bars."""
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    for gauge in gauges:
        table.add_row(f"{gauge.name}", f"{bar(gauge.percent / 100, 10)} {gauge.percent:3.0f}%")
        if gauge.detail:
            table.add_row("", Text(gauge.detail, style="dim"))
    return Panel(table, title="system (this machine)", border_style="blue")


THROUGHPUT = (
    ("games/s", keys.GAMES_PER_S, ".2f"),
    ("game tokens/s", keys.GAME_TOKENS_PER_S, ",.0f"),
    ("inference tokens/s", keys.INFERENCE_TOKENS_PER_S, ",.0f"),
    ("inference batch size", keys.INFERENCE_MEAN_BATCH_SIZE, ".1f"),
    ("inference busy", keys.INFERENCE_BUSY_FRACTION, ".2f"),
    ("learner tokens/s", keys.TRAIN_TOKENS_PER_S, ",.0f"),
    ("learner step time (s)", keys.UPDATE_SECONDS, ".2f"),
    ("learner wait (s)", keys.WAIT_SECONDS, ".2f"),
    ("learner wait share", keys.WAIT_SHARE, ".0%"),  # of the step's wall time, waiting for data
    ("collection held back", keys.HELD_BACK_SHARE, ".0%"),  # of the game slots' time, waiting for the learner
)


def throughput(rows: list[dict[str, Any]]) -> Panel:
    """Games and tokens per second, per inference actor too, and the learner's speed."""
    table = _metric_table(rows, THROUGHPUT)
    for actor, tokens_per_s in enumerate(latest_value(rows, keys.INFERENCE_TOKENS_PER_S_BY_ACTOR, [])):
        table.add_row(f"  actor {actor} tokens/s", f"{tokens_per_s:,.0f}")
    _, games_per_s = series(rows, keys.GAMES_PER_S)
    table.add_row("games/s trend", "")
    return Panel(Group(table, trend(games_per_s, 24, ".2f")), title="throughput")


GAMES = (
    ("format ok", keys.FORMAT_OK_RATE, ".2f"),
    ("invalid moves", keys.INVALID_MOVE_RATE, ".2f"),
    ("game length (turns)", keys.MEAN_TURNS, ".1f"),
    ("game length (s)", keys.MEAN_GAME_SECONDS, ".2f"),
    ("time per turn (s)", keys.SECONDS_PER_TURN, ".3f"),
    ("action entropy (bits)", keys.ACTION_ENTROPY, ".2f"),
    ("distinct moves", keys.DISTINCT_ACTIONS, ".0f"),
    ("training games", keys.TOTAL_TRAIN_GAMES, ",.0f"),
    ("failed games", keys.TOTAL_FAILED_GAMES, ",.0f"),
)


def games(rows: list[dict[str, Any]]) -> Panel:
    """How the training games go: answer format, invalid moves, length, timing and move diversity."""
    return Panel(_metric_table(rows, GAMES), title="games (rolling window)")


LEARNER = (
    ("loss", keys.LOSS, "+.4f"),
    ("mean reward", keys.MEAN_REWARD, "+.3f"),
    ("grad norm", keys.GRAD_NORM, ".3f"),
    ("importance ratio", keys.RATIO_MEAN, ".3f"),
    ("batch size", keys.BATCH_SIZE, ".0f"),
)


def learner(rows: list[dict[str, Any]]) -> Panel:
    """The newest loss terms with a sparkline of the loss and of the mean reward."""
    _, losses = series(rows, keys.LOSS)
    _, rewards = series(rows, keys.MEAN_REWARD)
    trends = Table.grid(padding=(0, 1))
    trends.add_row("loss  ", trend(losses, spec="+.3f", style="magenta"))
    trends.add_row("reward", trend(rewards, spec="+.2f"))
    return Panel(Group(_metric_table(rows, LEARNER), trends), title="learner")


def buffer(rows: list[dict[str, Any]]) -> Panel:
    """The StepBuffer's fill and flow, and how many updates old the trained samples are."""
    size = latest_value(rows, keys.BUFFER_SIZE, 0)
    capacity = latest_value(rows, keys.BUFFER_CAPACITY)
    fill = Text(f"{size} / {capacity} steps  {bar(size / capacity, 16)}" if capacity else f"{size} steps")
    table = _metric_table(
        rows,
        (
            ("steps added", keys.BUFFER_STEPS_ADDED, ",.0f"),
            ("steps dropped (full)", keys.BUFFER_STEPS_DROPPED, ",.0f"),
            ("games held back", keys.GAMES_HELD_BACK, ",.0f"),
            ("staleness mean", keys.STALENESS_MEAN, ".2f"),
            ("staleness max", keys.STALENESS_MAX, ".0f"),
            ("stale steps dropped", keys.STALE_DROPPED, ".0f"),
        ),
    )
    return Panel(Group(fill, table), title="buffer and staleness")


def ladder(rows: list[dict[str, Any]], limit: int = 10) -> Panel:
    """The pool's rating ladder as the pool orders it (ranked agents by conservative score, then the provisional
    ones, dimmed, with no odds), with each agent's rated games and odds against the latest checkpoint."""
    table = Table(expand=True, box=None)
    for column in ("agent", "mu", "sigma", "mu-3σ", "games", "P(beats latest)"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    for entry in latest_value(rows, keys.POOL_LADDER, [])[:limit]:
        numbers = [f"{entry[name]:.1f}" for name in ("mu", "sigma", "conservative")]
        table.add_row(
            agent_label(entry["agent"]),
            *numbers,
            _fmt(entry.get("games"), "d"),
            _fmt(entry.get("win_probability"), ".2f"),
            style="dim" if entry.get("provisional") else None,
        )
    return Panel(table, title=f"rating ladder ({latest_value(rows, keys.POOL_GAMES_RATED, 0)} games rated)")


def match_heatmap(rows: list[dict[str, Any]]) -> Panel:
    """Win rate of each row agent against each column agent (the busiest agents), coloured red to green,
    and each row agent's games against them all."""
    matrix = latest_value(rows, keys.POOL_MATCH_MATRIX, {})
    agents = busiest_agents(matrix, HEATMAP_AGENTS)
    table = Table(box=None, padding=(0, 1))
    table.add_column("")
    for agent in agents:
        table.add_column(agent, justify="center", no_wrap=True)
    table.add_column("games", justify="right", style="dim")
    for agent in agents:
        opponents = matrix.get(agent, {})
        cells = [_heat_cell(opponents[o]["win_rate"]) if o in opponents else Text("·", style="dim") for o in agents]
        table.add_row(agent_label(agent), *cells, str(sum(cell["games"] for cell in opponents.values())))
    return Panel(table, title="match heatmap: win rate of row vs column")


def _heat_cell(rate: float) -> Text:
    red, green = round(200 * (1 - rate)), round(200 * rate)
    return Text(f" {rate:.2f} ", style=f"black on rgb({red},{green},60)")


def evaluation(rows: list[dict[str, Any]]) -> Panel:
    """The eval W/D/L of the eval games played during training (the rolling window, collector.num_eval_workers),
    with the win rate's 95% interval and its trend, then the start and end evaluations, each line saying which games
    it counts (the window of a run with no eval games during training holds only the start evaluation, which it
    showed as "last N games")."""
    during = [row for row in eval_window_rows(rows) if row[keys.STEP] > 0]  # row 0's window: the start evaluation
    table = Table.grid(padding=(0, 1))
    if during:
        latest = during[-1]
        win, low, high = latest[keys.EVAL_WIN_RATE], latest[keys.EVAL_WIN_LOW], latest[keys.EVAL_WIN_HIGH]
        draw, loss = latest[keys.EVAL_DRAW_RATE], latest[keys.EVAL_LOSS_RATE]
        games = latest[keys.EVAL_GAMES]
        table.add_row(f"training, last {games} eval games", f"W {win:.2f} D {draw:.2f} L {loss:.2f}")
        table.add_row("win 95% CI", f"[{low:.2f}, {high:.2f}]  n={games}")
        table.add_row("", interval_bar(low, win, high))
        table.add_row("win trend", trend([row[keys.EVAL_WIN_RATE] for row in during], 30, ".2f", "cyan"))
    else:
        table.add_row("during training", "no eval games (collector.num_eval_workers)")
    final = final_row(rows)
    start = final.get("eval_start") or next(
        (r["eval_start"] for r in rows if r.get(keys.STEP) == 0 and "eval_start" in r), {}
    )
    for label, result in (("eval start", start), ("eval end", final.get("eval_end", {}))):
        if result.get("games"):
            low, high = result["win_ci"]
            table.add_row(
                label,
                f"W {result['win_rate']:.2f} [{low:.2f}, {high:.2f}] D {result['draw_rate']:.2f} "
                f"L {result['loss_rate']:.2f} n={result['games']}",
            )
    return Panel(table, title="evaluation")
