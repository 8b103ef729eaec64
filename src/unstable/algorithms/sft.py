"""Supervised fine-tuning: maximise the likelihood of given completions (the warm start's algorithm).

    loss = -(1/T) sum_i sum_t log pi(a_it | s_i, a_i<t)

T is the number of completion tokens in the whole batch (a masked mean NLL), so long and short completions
weigh the same per token. Rewards and behaviour log-probs are ignored. One optimizer step per batch.
"""

from __future__ import annotations

from unstable.algorithms.base import BaseAlgo
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class SFT(BaseAlgo):
    """Masked mean negative log-likelihood over completion tokens."""

    def check_num_learners(self, num_learners: int) -> None:
        """Refuses several learners: the loss is a mean over tokens, not steps (see the error)."""
        if num_learners > 1:
            raise ValueError(
                f"sft cannot run on {num_learners} learners: its loss is a mean over the batch's completion tokens, "
                "which the mean of equal shards' token means is not; use learner.num_learners 1"
            )

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch."""
        batches = self.prepare_batch(steps, policy)
        num_tokens = sum(float(batch.completion_mask.sum()) for batch in batches)
        total_loss = 0.0
        for batch in batches:
            logp = policy.forward(batch).logprobs  # (b, L-1)
            loss = -(logp * batch.completion_mask).sum() / max(num_tokens, 1.0)
            loss.backward()
            total_loss += loss.item()
        grad_norm = policy.optimizer_step()
        return {keys.LOSS: total_loss, keys.GRAD_NORM: grad_norm}
