"""The algorithm interface: the learner owns the plumbing, an algorithm owns the math and its schedule.

An algorithm gets the batch of steps and the learner; it asks the learner for micro-batches and token
log-probs, calls `backward` on its own losses and decides when to call `learner.optimizer_step()` (once per
batch for REINFORCE, several epochs of minibatches for PPO). The seed's `prepare_batch`/`update(batch,
scaling)` pair maps onto `learner.micro_batches` and this `update`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from unstable.records import Step

if TYPE_CHECKING:
    from unstable.learner.learner import StandardLearner


class BaseAlgo(ABC):
    """Base class for learning algorithms plugged into `StandardLearner`."""

    def initialize(self, learner: StandardLearner) -> None:
        """Called once after the model and optimizer exist (e.g. to add a value head's parameters)."""
        return None

    @abstractmethod
    def update(self, steps: list[Step], learner: StandardLearner) -> dict[str, float]:
        """Train on one batch of steps; return metrics named `learner/<name>`."""


def normalized_sum(token_values: torch.Tensor, completion_mask: torch.Tensor, max_generation_len: int | None):
    """Each row's sum of `token_values` over its completion tokens divided by D, `(B,)`.

    D is the constant `max_generation_len` when given (Dr. GRPO's length-unbiased normaliser, as in the seed)
    or the row's own completion length otherwise.
    """
    total = (token_values * completion_mask).sum(-1)  # (B,)
    if max_generation_len is not None:
        return total / max_generation_len
    return total / completion_mask.sum(-1).clamp(min=1.0)
