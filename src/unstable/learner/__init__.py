"""The learner: a policy model, and the optimizer and algorithm that update it."""

from unstable.learner.config import (
    AlgorithmConfig,
    LearnerConfig,
    LoraConfig,
    OptimizerConfig,
    PolicyConfig,
    WarmStartConfig,
)

_TORCH_MODULES = {"Learner": "unstable.learner.learner", "PolicyModel": "unstable.learner.policy_model"}


def __getattr__(name: str):
    """`Learner` and `PolicyModel` imported on first use: the settings above (and `import unstable.config`) need
    no torch."""
    if name not in _TORCH_MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_TORCH_MODULES[name]), name)


__all__ = [
    "AlgorithmConfig",
    "Learner",
    "LearnerConfig",
    "LoraConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "PolicyModel",
    "WarmStartConfig",
]
