"""The learner: a policy model, and the optimizer and algorithm that update it."""

from unstable.learner.config import (
    AlgorithmConfig,
    LearnerConfig,
    LoraConfig,
    OptimizerConfig,
    PolicyConfig,
    WarmStartConfig,
)
from unstable.learner.learner import Learner
from unstable.learner.policy_model import PolicyModel

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
