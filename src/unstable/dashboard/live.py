"""A live terminal view of a run: it follows the run's `metrics.jsonl`, so it attaches to any run, running or
finished, on this machine or a copied run directory, without talking to Ray."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.layout import Layout
from rich.live import Live
from rich.panel import Panel

from unstable.dashboard import panels
from unstable.dashboard.system import Gauge, system_gauges
from unstable.tracking.history import METRICS_FILE, RowFollower

STALE_AFTER_S = 30.0  # a run that wrote no row for this long is shown as quiet rather than running
ONCE_MIN_HEIGHT = 46  # lines of a printed frame when the terminal is smaller (or not a terminal), so no panel is cut
KEPT_ROWS = 500  # rows the live view keeps: the trends show fewer, the newest values need only the last ones


def planned_steps(run_dir: str | Path) -> int | None:
    """`learner.num_steps` from the run's `config.yaml` (None for runs started without one)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    return (yaml.safe_load(path.read_text()) or {}).get("learner", {}).get("num_steps")


def is_writing(run_dir: str | Path) -> bool:
    """True while the run's `metrics.jsonl` changed within the last `STALE_AFTER_S` seconds."""
    path = Path(run_dir) / METRICS_FILE
    return path.is_file() and time.time() - path.stat().st_mtime < STALE_AFTER_S


def render(run_dir: str | Path, rows: list[dict[str, Any]], gauges: list[Gauge], live: bool = True) -> Layout:
    """One frame: a header; throughput, games, learner; rating ladder, match heatmap; buffer, evaluation, system."""
    layout = Layout()
    layout.split_column(Layout(name="header", size=3), Layout(name="top"), Layout(name="middle"), Layout(name="bottom"))
    layout["header"].update(panels.header(Path(run_dir).name, rows, planned_steps(run_dir), live))
    layout["top"].split_row(Layout(panels.throughput(rows)), Layout(panels.games(rows)), Layout(panels.learner(rows)))
    layout["middle"].split_row(Layout(panels.ladder(rows), ratio=2), Layout(panels.match_heatmap(rows), ratio=3))
    layout["bottom"].split_row(
        Layout(panels.buffer(rows)), Layout(panels.evaluation(rows), ratio=2), Layout(panels.system(gauges))
    )
    return layout


def waiting(run_dir: str | Path) -> Panel:
    """The frame shown until the run writes its first row."""
    return Panel(f"waiting for {Path(run_dir) / METRICS_FILE} ...", title="unstable-baselines")


def watch(run_dir: str | Path, interval_s: float = 2.0, once: bool = False, console: Console | None = None) -> None:
    """Show the run, refreshed every `interval_s` seconds until interrupted (`once`: one frame, then return).

    A run directory that exists but has no rows yet is waited for."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} {'is not a directory' if run_dir.exists() else 'does not exist'}"
        )
    console = console or Console()
    if once:
        frame = render(run_dir, RowFollower(run_dir).poll(), system_gauges(), is_writing(run_dir))
        console.print(frame, height=max(console.height, ONCE_MIN_HEIGHT))
        return
    with Live(waiting(run_dir), console=console, screen=True, auto_refresh=False) as live:
        while not (run_dir / METRICS_FILE).is_file():
            time.sleep(interval_s)
        follower, rows = RowFollower(run_dir), deque(maxlen=KEPT_ROWS)
        while True:
            rows.extend(follower.poll())
            live.update(render(run_dir, list(rows), system_gauges(), is_writing(run_dir)), refresh=True)
            time.sleep(interval_s)
