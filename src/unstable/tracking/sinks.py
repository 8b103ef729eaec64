"""Where the Tracker's rows go besides `metrics.jsonl`: sinks with `write(row)` and `close()`."""

from __future__ import annotations

import logging
import os
from numbers import Real
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a row (nested tables such as the rating ladder are left to the JSONL file)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, Real) and not isinstance(v, bool)}


class WandbSink:
    """Logs each row's scalars to Weights & Biases: online when `WANDB_API_KEY` is set, offline otherwise
    (`wandb sync` uploads an offline run later). `mode` forces one ('online', 'offline' or 'disabled')."""

    def __init__(self, project: str, run_name: str, run_dir: str | os.PathLike, mode: str | None = None):
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                f"wandb_project={project!r} needs W&B: pip install 'unstable-baselines[wandb]' (or pass no project)"
            ) from exc

        mode = mode or os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = wandb.init(project=project, name=run_name, dir=str(Path(run_dir)), mode=mode)
        self.rows = 0
        log.info("W&B %s run %s/%s in %s", mode, project, run_name, run_dir)

    def write(self, row: dict[str, Any]) -> None:
        """Log the row's scalars at the next W&B step."""
        self.run.log(scalars(row), step=self.rows)
        self.rows += 1

    def close(self) -> None:
        """Finish the W&B run (flushes an offline run's files)."""
        self.run.finish()
