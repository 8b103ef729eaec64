"""`unstable report RUN_DIR`: PNG plots and a Markdown summary of a run, made from its `metrics.jsonl` only."""

from unstable.report.write import write_report

__all__ = ["write_report"]
