"""The original UnstableBaselines API: its actor classes, a thin adapter over the runtime's own.

`unstable.Tracker`, `StepBuffer`, `ModelPool`, `Collector` and `StandardLearner` are used as Ray actor classes
(`unstable.Tracker.options(name="Tracker").remote(run_name="demo", wandb_project="UB")`). Each is an `OriginalActor`
here: its `remote` translates the original API's keyword arguments into the component's settings section (a
`TrackerConfig`, `BufferConfig`, `PoolConfig`, ...) and starts the actor of `runtime.actors` that the YAML path's
builder (`runtime.topology`) starts with its config's section; this is the one place where those keywords are read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from unstable.buffer.config import BufferConfig, RewardStages
from unstable.pool.config import PoolConfig
from unstable.runtime.actors import ModelPoolActor, StepBufferActor, TrackerActor
from unstable.tracking import TrackerConfig, new_run_dir


class OriginalActor:
    """One of the original API's actor classes: `options(**ray_options)` and `remote(*args, **keywords)` as on a
    Ray actor class. `remote` hands the Ray options and the original API's arguments to `start`, which translates
    them into the component's settings and starts the runtime's actor; it returns that actor's handle."""

    def __init__(self, start: Callable[..., Any], ray_options: dict[str, Any] | None = None):
        self._start = start
        self._ray_options = ray_options or {}

    def options(self, **ray_options: Any) -> OriginalActor:
        """This class with `ray_options` (`name`, `num_gpus`, ...) for the actor it starts."""
        return OriginalActor(self._start, self._ray_options | ray_options)

    def remote(self, *args: Any, **keywords: Any) -> Any:
        """Start the actor from the original API's arguments; returns its handle."""
        return self._start(self._ray_options, *args, **keywords)


def _tracker(ray_options: dict[str, Any], run_name: str = "run", wandb_project: str | None = None) -> Any:
    """The original API's `Tracker(run_name, wandb_project)`: the run directory `runs/run_name` (the next free `-2`,
    `-3`, ... when taken); W&B (in its 'auto' mode) only with `wandb_project`."""
    cfg = TrackerConfig(wandb="auto", wandb_project=wandb_project) if wandb_project else TrackerConfig(wandb="disabled")
    run_dir = new_run_dir(Path("runs") / run_name).resolve()
    return TrackerActor.options(**ray_options).remote(cfg, str(run_dir), run_name)


def _step_buffer(
    ray_options: dict[str, Any],
    max_buffer_size: int = BufferConfig.model_fields["max_buffer_size"].default,
    tracker=None,
    final_reward_transformation: Callable | None = None,
    step_reward_transformation: Callable | None = None,
    sampling_reward_transformation: Callable | None = None,
) -> Any:
    """The original API's `StepBuffer(max_buffer_size, tracker, final/step/sampling_reward_transformation)`: its
    transformations are the buffer's reward stages as given (a stage left out has none)."""
    stages = RewardStages(final_reward_transformation, step_reward_transformation, sampling_reward_transformation)
    cfg = BufferConfig(
        max_buffer_size=max_buffer_size,
        final_reward_transforms=[],
        step_reward_transforms=[],
        sampling_reward_transforms=[],
    )
    return StepBufferActor.options(**ray_options).remote(cfg, tracker, stages=stages)


def _model_pool(ray_options: dict[str, Any], tracker=None, **settings: Any) -> Any:
    """The original API's `ModelPool(sample_mode=..., max_active_lora=..., tracker=...)`: every `PoolConfig` field
    by keyword (its default when left out)."""
    return ModelPoolActor.options(**ray_options).remote(PoolConfig(**settings), tracker)


Tracker = OriginalActor(_tracker)
StepBuffer = OriginalActor(_step_buffer)
ModelPool = OriginalActor(_model_pool)
