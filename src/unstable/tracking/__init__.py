"""Metrics: the Tracker and the game summaries it aggregates."""

from unstable.tracking.tracker import Tracker, summarize_game

__all__ = ["Tracker", "summarize_game"]
