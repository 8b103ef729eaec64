"""The terminal dashboard: a live Rich view of a run, read from its `metrics.jsonl`."""

from unstable.dashboard.live import render, watch

__all__ = ["render", "watch"]
