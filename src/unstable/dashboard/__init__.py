"""The terminal dashboard: a live Rich view of a run, read from its `metrics.jsonl`."""

from unstable.dashboard.live import find_latest_run, read_rows, render, watch

__all__ = ["find_latest_run", "read_rows", "render", "watch"]
