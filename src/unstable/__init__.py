"""unstable-baselines: asynchronous, online, multi-agent RL that trains language models by self-play.

The public names follow the original UnstableBaselines API. `Tracker`, `StepBuffer`, `ModelPool`, `Collector`
and `StandardLearner` are used as Ray actor classes with the original API's keyword arguments
(`unstable.Tracker.options(name="Tracker").remote(run_name="demo")`): a thin adapter (`unstable.runtime.original_api`)
that translates them into each component's settings and starts the runtime's actor; the plain classes live in
their folders (`unstable.tracking.Tracker`, `unstable.buffer.StepBuffer`, ...) and run without Ray.
`algorithms.Reinforce` and `reward_transformations` are as in the original API. Heavy dependencies (torch,
transformers, vLLM, Ray) load only when used.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Tracker": ("unstable.runtime.original_api", "Tracker"),
    "StepBuffer": ("unstable.runtime.original_api", "StepBuffer"),
    "ModelPool": ("unstable.runtime.original_api", "ModelPool"),
    "Collector": ("unstable.runtime.original_api", "Collector"),
    "StandardLearner": ("unstable.runtime.original_api", "StandardLearner"),
    "Learner": ("unstable.learner", "Learner"),
    "PolicyModel": ("unstable.learner", "PolicyModel"),
    "EnvSpec": ("unstable.records", "EnvSpec"),
    "Step": ("unstable.records", "Step"),
    "GameRecord": ("unstable.records", "GameRecord"),
    "play_episode": ("unstable.games", "play_episode"),
}
_SUBMODULES = ("algorithms", "reward_transformations")

__all__ = [*_EXPORTS, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        return getattr(import_module(module), attribute)
    if name in _SUBMODULES:
        return import_module(f"unstable.{name}")
    raise AttributeError(f"module 'unstable' has no attribute {name!r}")
