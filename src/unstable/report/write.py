"""Writes a run's report: one PNG per view (eval win rate, ratings, match heatmap, throughput, losses) and a
Markdown summary, into `RUN_DIR/report/`. Everything comes from `metrics.jsonl`; matplotlib draws off-screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unstable.report import data
from unstable.tracking import keys
from unstable.tracking.balance import balance_lines
from unstable.tracking.history import final_row, latest_value, learner_rows, read_rows, series

LABELS = {
    keys.GAMES_PER_S: "training games / s",
    keys.INFERENCE_TOKENS_PER_S: "inference tokens / s (all actors)",
    keys.TRAIN_TOKENS_PER_S: "learner tokens / s",
}


def _pyplot():
    """matplotlib's pyplot on the off-screen Agg backend, or an ImportError naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("unstable report needs matplotlib: pip install 'unstable-baselines[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_eval(rows: list[dict[str, Any]], path: Path) -> None:
    """Rolling eval win rate with its 95% interval over learner steps, the start and end evaluations, and the
    training games' win rate against the busiest fixed opponent."""
    plt = _pyplot()
    curve = data.eval_curve(rows)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(curve["steps"]) > 1:  # eval games ran beside training (`collector.num_eval_workers`)
        ax.fill_between(curve["steps"], curve["low"], curve["high"], alpha=0.25, label="95% Wilson interval")
        ax.plot(curve["steps"], curve["win_rate"], marker="o", label="win rate (rolling window of eval games)")
    reference = data.reference_opponent(rows)
    training = data.training_win_rate(rows, reference) if reference else {"steps": []}
    if training["steps"]:
        label = f"training games vs {reference} (the collector's rolling window, up to {max(training['games'])} games)"
        ax.plot(training["steps"], training["win_rate"], linestyle="--", color="tab:orange", label=label)
    final = final_row(rows)
    last_step = max((row[keys.STEP] for row in learner_rows(rows)), default=0)
    for label, step, color in (("eval_start", 0, "tab:gray"), ("eval_end", last_step, "tab:green")):
        result = final.get(label, {})
        if result.get("games"):
            low, high = result["win_ci"]
            rate = result["win_rate"]
            error = [[rate - low], [high - rate]]
            name = f"{label.replace('_', ' ')} ({result['games']} games)"
            ax.errorbar([step], [rate], yerr=error, fmt="s", color=color, capsize=5, label=name)
    _step_axis(ax)
    ax.set(ylabel="win rate", ylim=(-0.02, 1.02), title="Evaluation, and training games against a fixed opponent")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    _save(fig, path)


def plot_ratings(rows: list[dict[str, Any]], path: Path) -> None:
    """TrueSkill mu (+-1 sigma) of each fixed opponent over learner steps, and of each checkpoint on its own games
    (the newest ladder holding it, at the step that made it; provisional ones faint), relative to the busiest fixed
    opponent when there is one."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    reference = data.reference_opponent(rows)
    for agent, line in data.rating_history(rows, relative_to=reference).items():
        low = [m - s for m, s in zip(line["mu"], line["sigma"])]
        high = [m + s for m, s in zip(line["mu"], line["sigma"])]
        marker = "o" if len(line["steps"]) < 3 else None  # an agent that played at few steps only
        (drawn,) = ax.plot(line["steps"], line["mu"], label=agent, linewidth=1.5, marker=marker)
        ax.fill_between(line["steps"], low, high, alpha=0.12, color=drawn.get_color(), linewidth=0)
    points = data.checkpoint_ratings(rows, relative_to=reference)
    for provisional, label, alpha in ((False, "checkpoints", 1.0), (True, "checkpoints (provisional)", 0.3)):
        chosen = [i for i, p in enumerate(points["provisional"]) if p == provisional]
        if chosen:
            ax.errorbar(
                [points["steps"][i] for i in chosen],
                [points["mu"][i] for i in chosen],
                yerr=[points["sigma"][i] for i in chosen],
                fmt="o",
                markersize=3,
                color="black",
                alpha=alpha,
                label=label,
            )
    _step_axis(ax)
    ylabel = f"rating mu - mu of {reference} (±1 sigma)" if reference else "rating mu (±1 sigma)"
    ax.set(ylabel=ylabel, title="Ratings (fixed opponents at the steps they played; checkpoints on their own games)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    _save(fig, path)


def plot_match_heatmap(rows: list[dict[str, Any]], path: Path) -> None:
    """The newest match matrix: row agent's win rate against each column agent, with the games played."""
    plt = _pyplot()
    matrix = data.match_matrix(rows)
    agents = matrix["agents"]
    values = [[float("nan") if rate is None else rate for rate in row] for row in matrix["win_rate"]]
    size = 1.2 + 0.8 * max(len(agents), 2)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    ax.set_facecolor("0.85")  # pairs that never met stay grey
    image = ax.imshow(values, cmap="RdYlGn", vmin=0, vmax=1)
    for i, row in enumerate(matrix["win_rate"]):
        for j, rate in enumerate(row):
            if rate is not None:
                ax.text(j, i, f"{rate:.2f}\nn={matrix['games'][i][j]}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(agents)), agents, rotation=45, ha="right")
    ax.set_yticks(range(len(agents)), agents)
    ax.set(
        xlabel="opponent (column)",
        ylabel="agent (row)",
        title="Win rate of row agent vs column agent (grey: never met)",
    )
    fig.colorbar(image, ax=ax, label="win rate")
    _save(fig, path)


def plot_throughput(rows: list[dict[str, Any]], path: Path) -> None:
    """Games per second, inference tokens per second and learner tokens per second, one panel each."""
    plt = _pyplot()
    lines = data.metric_lines(rows, data.THROUGHPUT_KEYS)
    fig, axes = plt.subplots(len(lines) or 1, 1, figsize=(8, 2.2 * max(len(lines), 1)), sharex=True, squeeze=False)
    for ax, (key, (steps, values)) in zip(axes[:, 0], lines.items()):
        ax.plot(steps, values, marker=".")
        ax.set_ylabel(LABELS[key], fontsize=8)
        ax.grid(alpha=0.3)
    _step_axis(axes[-1, 0])
    axes[0, 0].set_title("Throughput (per learner step)")
    _save(fig, path)


def plot_losses(rows: list[dict[str, Any]], path: Path) -> None:
    """The total loss and every other loss term the algorithm reported (a term equal to the total is named in
    the total's label instead of drawn over it), and the batch's mean reward, over learner steps."""
    plt = _pyplot()
    fig, (loss_ax, reward_ax) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    lines = data.metric_lines(rows, data.LOSS_KEYS)
    total = lines.pop(keys.LOSS, None)
    same = [key for key, line in lines.items() if line == total]
    if total:
        names = "".join(f" = {key.removeprefix('learner/')}" for key in same)
        loss_ax.plot(*total, label=f"loss (total){names}", linewidth=2.5)
    for key, (steps, values) in lines.items():
        if key not in same:
            loss_ax.plot(steps, values, label=key.removeprefix("learner/"), linewidth=1.2)
    loss_ax.set(ylabel="loss", title="Learner")
    loss_ax.legend(loc="best", fontsize=8)
    loss_ax.grid(alpha=0.3)
    reward_ax.plot(*series(rows, keys.MEAN_REWARD), color="tab:green")
    _step_axis(reward_ax)
    reward_ax.set(ylabel="mean reward of the batch")
    reward_ax.grid(alpha=0.3)
    _save(fig, path)


def _step_axis(ax) -> None:
    """Label the x axis 'learner step' with whole-number ticks (axes sharing it get them too)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("learner step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)


PLOTS = {
    "eval_win_rate.png": plot_eval,
    "ratings.png": plot_ratings,
    "match_heatmap.png": plot_match_heatmap,
    "throughput.png": plot_throughput,
    "losses.png": plot_losses,
}


def summary_markdown(run_name: str, rows: list[dict[str, Any]], images: list[str]) -> str:
    """The report's Markdown: the run's totals and balance (`tracking.balance`), evaluations with intervals, final
    ladder and the plots."""
    steps = learner_rows(rows)
    last = steps[-1] if steps else {}
    final = final_row(rows)
    lines = [
        f"# Run report: {run_name}",
        "",
        f"- learner steps: {last.get(keys.STEP, 0)}",
        f"- wall clock: {latest_value(rows, keys.TIME, 0.0):.0f} s",
        f"- training games: {latest_value(rows, keys.TOTAL_TRAIN_GAMES, 0)}, eval games: "
        f"{latest_value(rows, keys.TOTAL_EVAL_GAMES, 0)}, "
        f"failed games: {latest_value(rows, keys.TOTAL_FAILED_GAMES, 0)}",
        f"- final loss: {_number(last.get(keys.LOSS), '+.4f')}, "
        f"mean reward: {_number(last.get(keys.MEAN_REWARD), '+.3f')}",
        f"- format ok: {_number(last.get(keys.FORMAT_OK_RATE), '.2f')}, invalid moves: "
        f"{_number(last.get(keys.INVALID_MOVE_RATE), '.2f')}, action entropy: "
        f"{_number(last.get(keys.ACTION_ENTROPY), '.2f')} bits",
        *(f"- {line}" for line in balance_lines(rows)),
        "",
        "## Evaluation (learner vs the eval opponents, 95% Wilson intervals)",
        "",
        "| when | games | win | win 95% CI | draw | loss |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("eval_start", "eval_end"):
        result = final.get(label, {})
        if result.get("games"):
            low, high = result["win_ci"]
            lines.append(
                f"| {label.removeprefix('eval_')} | {result['games']} | {result['win_rate']:.2f} | "
                f"[{low:.2f}, {high:.2f}] | {result['draw_rate']:.2f} | {result['loss_rate']:.2f} |"
            )
    if len(data.eval_curve(rows)["steps"]) > 1:  # the rolling window saw eval games during training
        lines.append(
            f"| rolling, step {last[keys.STEP]} | {last[keys.EVAL_GAMES]} | {last[keys.EVAL_WIN_RATE]:.2f} | "
            f"[{last[keys.EVAL_WIN_LOW]:.2f}, {last[keys.EVAL_WIN_HIGH]:.2f}] | {last[keys.EVAL_DRAW_RATE]:.2f} | "
            f"{last[keys.EVAL_LOSS_RATE]:.2f} |"
        )
    lines += [
        "",
        "## Rating ladder (last row; provisional: too few rated games to be ranked)",
        "",
        "| agent | mu | sigma | mu - 3 sigma | games |",
        "|---|---|---|---|---|",
    ]
    for entry in latest_value(rows, keys.POOL_LADDER, [])[:10]:
        agent = f"{entry['agent']} (provisional)" if entry.get("provisional") else entry["agent"]
        numbers = f"{entry['mu']:.2f} | {entry['sigma']:.2f} | {entry['conservative']:.2f}"
        lines.append(f"| {agent} | {numbers} | {entry.get('games', 'n/a')} |")
    lines += ["", "## Plots", ""] + [f"![{Path(image).stem}]({image})" for image in images]
    return "\n".join(lines) + "\n"


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "n/a"


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write every plot and `report.md` to `out_dir` (default `run_dir/report`); returns the Markdown's path."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    if not learner_rows(rows):
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no learner rows yet: nothing to report")
    out = Path(out_dir) if out_dir else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    for name, plot in PLOTS.items():
        plot(rows, out / name)
    path = out / "report.md"
    path.write_text(summary_markdown(run_dir.name, rows, list(PLOTS)))
    return path
