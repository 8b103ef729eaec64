"""The algorithm interface: the learner owns the plumbing, an algorithm owns the math and its schedule.

An algorithm gets the batch of steps and the learner; it asks the learner for micro-batches and token
log-probs, calls `backward` on its own losses and decides when to call `learner.optimizer_step()` (once per
batch for REINFORCE, several epochs of minibatches for PPO). As in the seed, `prepare_batch` turns steps into
tensors (by default the learner's token-budget micro-batches) and `update` computes the loss and steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from unstable.records import Step

if TYPE_CHECKING:
    from unstable.learner.batching import TokenBatch
    from unstable.learner.learner import StandardLearner


class BaseAlgo(ABC):
    """Base class for learning algorithms plugged into `StandardLearner`."""

    def initialize(self, learner: StandardLearner) -> None:
        """Called once after the model and optimizer exist (e.g. to add a value head's parameters)."""
        return None

    def prepare_batch(self, steps: list[Step], learner: StandardLearner) -> Iterator[TokenBatch]:
        """Steps to collated micro-batches on the learner's device (override to change the packing)."""
        return learner.micro_batches(steps)

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
