"""REINFORCE: raise the log-likelihood of each completion in proportion to its (transformed) reward.

    pg_loss = -(1/N) sum_i A_i * sum_t log pi(a_it | s_i, a_i<t) / D

A_i is the step's reward after the reward transforms (their baselines make it an advantage). D is the
constant `max_generation_len` when given (Dr. GRPO's unbiased normaliser, as in the seed) or the completion's
own length otherwise. One optimizer step per batch, gradients accumulated over micro-batches.
"""

from __future__ import annotations

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.batching import TokenBatch
from unstable.records import Step
from unstable.tracking import keys
from unstable.trainable import TrainablePolicy


class Reinforce(BaseAlgo):
    """Vanilla policy gradient on whole completions."""

    def __init__(self, max_generation_len: int | None = None):
        self.max_generation_len = max_generation_len

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch."""
        n = len(steps)
        pg_loss = 0.0
        for batch in self.prepare_batch(steps, policy):
            logp = policy.forward(batch).logprobs  # (b, L-1)
            policy.track_ratios(logp, batch)
            loss = self.loss(logp, batch, n)
            loss.backward()
            pg_loss += loss.item()
        grad_norm = policy.optimizer_step()
        return {keys.LOSS: pg_loss, keys.PG_LOSS: pg_loss, keys.GRAD_NORM: grad_norm}

    def loss(self, logp: torch.Tensor, batch: TokenBatch, n: int) -> torch.Tensor:
        """This micro-batch's share of the pg_loss over `n` steps, with A_i = `batch.rewards`."""
        seq_logp = normalized_sum(logp, batch.completion_mask, self.max_generation_len)  # (b,)
        return -(batch.rewards * seq_logp).sum() / n
