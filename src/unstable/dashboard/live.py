"""A live terminal view of a run: it follows the run's `metrics.jsonl`, so it attaches to any run, running or
finished, on this machine or a copied run directory, without talking to Ray."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from unstable.tracking import keys

PANEL_ROWS = (
    ("learner step", keys.STEP, "{:.0f}"),
    ("loss", keys.LOSS, "{:+.4f}"),
    ("mean reward", keys.MEAN_REWARD, "{:+.3f}"),
    ("learner tokens/s", keys.TRAIN_TOKENS_PER_S, "{:,.0f}"),
    ("games/s", keys.GAMES_PER_S, "{:.2f}"),
    ("inference tokens/s", keys.INFERENCE_TOKENS_PER_S, "{:,.0f}"),
    ("format ok", keys.FORMAT_OK_RATE, "{:.2f}"),
    ("invalid moves", keys.INVALID_MOVE_RATE, "{:.2f}"),
    ("buffer size", keys.BUFFER_SIZE, "{:.0f}"),
    ("staleness (mean)", keys.STALENESS_MEAN, "{:.2f}"),
    ("eval win rate", keys.EVAL_WIN_RATE, "{:.2f}"),
    ("games rated", keys.POOL_GAMES_RATED, "{:.0f}"),
)


def find_latest_run(runs_dir: str | Path = "runs") -> Path:
    """The run directory under `runs_dir` whose `metrics.jsonl` changed last."""
    files = sorted(Path(runs_dir).glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no run with a metrics.jsonl under {Path(runs_dir).resolve()}")
    return files[-1].parent


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete row of the run's `metrics.jsonl` (a line still being written is skipped)."""
    rows = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def render(run_dir: str | Path, rows: list[dict[str, Any]]) -> Group:
    """The run's latest numbers and its rating ladder as Rich tables."""
    latest = next((r for r in reversed(rows) if keys.STEP in r), {})
    overview = Table(title=f"{Path(run_dir).name}  ({len(rows)} rows, {latest.get(keys.TIME, 0):.0f}s)")
    overview.add_column("metric")
    overview.add_column("value", justify="right")
    for label, key, fmt in PANEL_ROWS:
        overview.add_row(label, fmt.format(latest[key]) if key in latest else "-")
    ladder = Table(title="rating ladder (mu - 3 sigma)")
    for column in ("agent", "mu", "sigma", "score"):
        ladder.add_column(column, justify="left" if column == "agent" else "right")
    for entry in latest.get(keys.POOL_LADDER, [])[:10]:
        ladder.add_row(entry["agent"], f"{entry['mu']:.2f}", f"{entry['sigma']:.2f}", f"{entry['conservative']:.2f}")
    return Group(overview, ladder)


def watch(run_dir: str | Path, interval_s: float = 2.0, once: bool = False, console: Console | None = None) -> None:
    """Show the run, refreshed every `interval_s` seconds until interrupted (`once`: one frame, then return)."""
    console = console or Console()
    if once:
        console.print(render(run_dir, read_rows(run_dir)))
        return
    with Live(render(run_dir, read_rows(run_dir)), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval_s)
            live.update(render(run_dir, read_rows(run_dir)))
