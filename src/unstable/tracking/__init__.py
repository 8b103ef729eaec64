"""Metrics: the Tracker, the game summaries it aggregates, and win/draw/loss statistics."""

from unstable.tracking.stats import WDL, wdl_summary, wilson_interval
from unstable.tracking.tracker import Tracker, new_run_dir, summarize_game, truncate_metrics

__all__ = ["WDL", "Tracker", "new_run_dir", "summarize_game", "truncate_metrics", "wdl_summary", "wilson_interval"]
