"""Where the Tracker's rows go besides `metrics.jsonl`: sinks with `write(row)` and `close()`.

`TensorBoardSink` writes event files under `run_dir/tensorboard`, `WandbSink` a W&B run under `run_dir/wandb`;
`make_sinks` builds the ones a `TrackerConfig` asks for.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from unstable.settings import is_number
from unstable.tracking import keys
from unstable.tracking.config import TrackerConfig

log = logging.getLogger(__name__)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a row; a list of numbers (tokens/s per inference actor) becomes `key/0`,
    `key/1`, ... (nested tables such as the rating ladder are left to the JSONL file)."""
    flat = {}
    for key, value in row.items():
        if is_number(value):
            flat[key] = float(value)
        elif isinstance(value, list) and value and all(is_number(v) for v in value):
            flat |= {f"{key}/{i}": float(v) for i, v in enumerate(value)}
    return flat


class TensorBoardSink:
    """Logs each row's scalars as TensorBoard summaries in `run_dir/tensorboard`, at the row's learner step
    (rows without one, such as the final summary row, at the previous row's step)."""

    def __init__(self, run_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.directory))
        self.step = 0

    def write(self, row: dict[str, Any]) -> None:
        """Add every scalar of the row at its learner step."""
        self.step = int(row.get(keys.STEP, self.step))
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=self.step, walltime=None)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class WandbSink:
    """Logs each row's scalars to Weights & Biases: online when `WANDB_API_KEY` is set, offline otherwise
    (`wandb sync` uploads an offline run later). `mode` forces one ('online', 'offline' or 'disabled')."""

    def __init__(self, project: str, run_name: str, run_dir: str | os.PathLike, mode: str | None = None):
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                f"wandb_project={project!r} needs W&B: pip install 'unstable-baselines[wandb]' "
                "(or turn W&B off: tracker.wandb: disabled)"
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


def make_sinks(cfg: TrackerConfig, run_dir: str | os.PathLike, run_name: str) -> list[Any]:
    """The sinks `cfg` asks for: TensorBoard when `cfg.tensorboard`, W&B unless `cfg.wandb` is 'disabled'
    (in 'auto' mode only when wandb is installed)."""
    sinks: list[Any] = []
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if cfg.wandb == "auto" and not _wandb_installed():
        log.warning("W&B is not installed, so this run logs to metrics.jsonl and TensorBoard only")
    elif cfg.wandb != "disabled":
        sinks.append(WandbSink(cfg.wandb_project, run_name, run_dir, mode=None if cfg.wandb == "auto" else cfg.wandb))
    return sinks


def _wandb_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("wandb") is not None
