"""Supervised fine-tuning: maximise the likelihood of given completions (the warm start's algorithm).

    loss = -(1/T) sum_i sum_t log pi(a_it | s_i, a_i<t)

T is the number of completion tokens in the whole batch (a masked mean NLL), so long and short completions
weigh the same per token. Rewards and behaviour log-probs are ignored. One optimizer step per batch.
"""

from __future__ import annotations

from unstable.algorithms.base import BaseAlgo
from unstable.records import Step


class SFT(BaseAlgo):
    """Masked mean negative log-likelihood over completion tokens."""

    def update(self, steps: list[Step], learner) -> dict[str, float]:
        """One gradient step over the whole batch."""
        batches = list(self.prepare_batch(steps, learner))
        num_tokens = sum(float(batch.completion_mask.sum()) for batch in batches)
        total_loss = 0.0
        for batch in batches:
            logp = learner.token_logprobs(batch)  # (b, L-1)
            loss = -(logp * batch.completion_mask).sum() / max(num_tokens, 1.0)
            loss.backward()
            total_loss += loss.item()
        grad_norm = learner.optimizer_step()
        return {"learner/loss": total_loss, "learner/grad_norm": grad_norm}
