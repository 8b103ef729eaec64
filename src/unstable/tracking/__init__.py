"""Metrics: the Tracker, its settings and sinks, the game summaries it aggregates, win/draw/loss statistics and
reading a run's rows back."""

from unstable.tracking.config import TrackerConfig
from unstable.tracking.stats import WDL, wdl_summary, wilson_interval
from unstable.tracking.tracker import (
    Tracker,
    cannot_make,
    new_run_dir,
    summarize_game,
    truncate_metrics,
)

__all__ = [
    "WDL",
    "Tracker",
    "TrackerConfig",
    "cannot_make",
    "new_run_dir",
    "summarize_game",
    "truncate_metrics",
    "wdl_summary",
    "wilson_interval",
]
