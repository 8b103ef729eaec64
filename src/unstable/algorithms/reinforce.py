"""REINFORCE: raise the log-likelihood of each completion in proportion to its (transformed) reward.

    loss = -(1/N) sum_i r_i * sum_t log pi(a_it | s_i, a_i<t) / D

D is the constant `max_generation_len` when given (Dr. GRPO's unbiased normaliser, as in the seed) or the
completion's own length otherwise. One optimizer step per batch, gradients accumulated over micro-batches.
"""

from __future__ import annotations

import torch

from unstable.algorithms.base import BaseAlgo
from unstable.records import Step


class Reinforce(BaseAlgo):
    """Vanilla policy gradient on whole completions."""

    def __init__(self, max_generation_len: int | None = None):
        self.max_generation_len = max_generation_len

    def update(self, steps: list[Step], learner) -> dict[str, float]:
        """One gradient step over the whole batch."""
        n = len(steps)
        total_loss = 0.0
        for batch in learner.micro_batches(steps):
            logp = learner.token_logprobs(batch)  # (b, L-1)
            seq_logp = (logp * batch.completion_mask).sum(-1)  # (b,)
            denom = self._normaliser(batch.completion_mask)  # (b,)
            loss = -(batch.rewards * seq_logp / denom).sum() / n
            loss.backward()
            total_loss += loss.item()
        grad_norm = learner.optimizer_step()
        return {"learner/pg_loss": total_loss, "learner/grad_norm": grad_norm}

    def _normaliser(self, completion_mask: torch.Tensor) -> torch.Tensor:
        if self.max_generation_len is not None:
            return torch.full_like(completion_mask[:, 0], float(self.max_generation_len))
        return completion_mask.sum(-1).clamp(min=1.0)
