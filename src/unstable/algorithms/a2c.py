"""A2C: policy gradient with a learned state value as the baseline.

A value head reads the model's last hidden state at the last prompt token (the state the decision was made
in). With V_i its prediction and r_i the step's reward (the game's outcome for that decision, after shaping):

    A_i        = r_i - V_i                                    (V_i detached)
    pg_loss    = -(1/N) sum_i A_i * sum_t log pi(a_it | s_i, a_i<t) / D
    value_loss = (1/N) sum_i (V_i - r_i)^2
    loss       = pg_loss + value_coef * value_loss

The value loss trains the head and, through the shared hidden state, the policy's own weights. One optimizer
step per batch; the head's parameters join the learner's optimizer (at `value_lr`). D as in `Reinforce`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.algorithms.value import attach_value_head
from unstable.batching import TokenBatch
from unstable.records import Step
from unstable.tracking import keys
from unstable.trainable import TrainablePolicy


class A2C(BaseAlgo):
    """Advantage actor-critic on whole completions with a value head on the decision state."""

    def __init__(
        self,
        value_coef: float = 0.5,
        value_lr: float | None = 1e-3,
        value_hidden_sizes: Sequence[int] = (),
        max_generation_len: int | None = None,
    ):
        self.value_coef = value_coef
        self.value_lr = value_lr
        self.value_hidden_sizes = tuple(value_hidden_sizes)
        self.max_generation_len = max_generation_len
        self.value_head = None

    def initialize(self, policy: TrainablePolicy) -> None:
        """Create the value head and hand its parameters to the policy's optimizer."""
        self.value_head = attach_value_head(policy, self.value_hidden_sizes, self.value_lr)

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch."""
        n = len(steps)
        totals = {keys.LOSS: 0.0, keys.PG_LOSS: 0.0, keys.VALUE_LOSS: 0.0, keys.VALUE_MEAN: 0.0}
        for batch in self.prepare_batch(steps, policy):
            out = policy.forward(batch, encodings=True)
            values = self.value_head(out.encodings)  # (b,)
            policy.track_ratios(out.logprobs, batch)
            pg_loss, value_loss = self.loss(out.logprobs, values, batch, n)
            loss = pg_loss + self.value_coef * value_loss
            loss.backward()
            totals[keys.LOSS] += loss.item()
            totals[keys.PG_LOSS] += pg_loss.item()
            totals[keys.VALUE_LOSS] += value_loss.item()
            totals[keys.VALUE_MEAN] += values.detach().sum().item() / n
        return totals | {keys.GRAD_NORM: policy.optimizer_step()}

    def loss(
        self, logp: torch.Tensor, values: torch.Tensor, batch: TokenBatch, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This micro-batch's shares of pg_loss and value_loss over `n` steps (returns r_i = `batch.rewards`)."""
        advantages = batch.rewards - values.detach()  # (b,)
        seq_logp = normalized_sum(logp, batch.completion_mask, self.max_generation_len)  # (b,)
        pg_loss = -(advantages * seq_logp).sum() / n
        value_loss = ((values - batch.rewards) ** 2).sum() / n
        return pg_loss, value_loss

    def state_dict(self) -> dict[str, Any]:
        """The value head's weights."""
        return {"value_head": self.value_head.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the value head."""
        self.value_head.load_state_dict(state["value_head"])
