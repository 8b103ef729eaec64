"""unstable-baselines: asynchronous, online, multi-agent RL that trains language models by self-play.

The public names follow the seed documents: `Collector`, `ModelPool`, `StepBuffer`, `Tracker`,
`algorithms.Reinforce` and `reward_transformations`; the learner is `Learner` around a `PolicyModel`. Each is a
plain class; `unstable.runtime` runs them as Ray actors. Heavy dependencies (torch, transformers, vLLM, Ray)
load only when used.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Collector": "unstable.collector",
    "ModelPool": "unstable.pool",
    "StepBuffer": "unstable.buffer",
    "Learner": "unstable.learner",
    "PolicyModel": "unstable.learner",
    "Tracker": "unstable.tracking",
    "EnvSpec": "unstable.records",
    "Step": "unstable.records",
    "GameRecord": "unstable.records",
    "play_episode": "unstable.games",
}
_SUBMODULES = ("algorithms", "reward_transformations")

__all__ = [*_EXPORTS, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return import_module(f"unstable.{name}")
    raise AttributeError(f"module 'unstable' has no attribute {name!r}")
