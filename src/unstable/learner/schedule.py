"""Learning-rate schedules: the factor that multiplies every parameter group's base rate at a learner update.

A schedule is a pure function of the update index, so resuming a run needs no scheduler state: the restored
update counter gives the same rate. `warmup_steps` ramps linearly from 1/warmup to 1 first; the schedule then
runs over the remaining updates and ends at `min_lr_ratio`.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _constant(progress: float) -> float:
    return 1.0


def _linear(progress: float) -> float:
    return 1.0 - progress


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# name -> shape on [0, 1] (1 at the start of decay, 0 at the last update); `learner.optimizer.lr_schedule` is
# validated here
LR_SCHEDULES: dict[str, Callable[[float], float]] = {"constant": _constant, "linear": _linear, "cosine": _cosine}


def lr_factor(update: int, num_steps: int, schedule: str, warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> float:
    """The multiplier of the base learning rate for 0-based `update` of `num_steps`."""
    if update < warmup_steps:
        return (update + 1) / warmup_steps
    decay_steps = max(num_steps - warmup_steps - 1, 1)
    progress = min((update - warmup_steps) / decay_steps, 1.0)
    shape = LR_SCHEDULES[schedule](progress)
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape
