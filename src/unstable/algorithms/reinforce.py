"""REINFORCE: raise the log-likelihood of each completion in proportion to its (transformed) reward, optionally
held near a reference policy (the warm start).

    pg_loss     = -(1/N) sum_i A_i * sum_t log pi(a_it | s_i, a_i<t) / D
    ref_kl_loss = ref_kl_coef * KL(pi || pi_ref)      (k3 estimate on the sampled tokens, mean over tokens)
    loss        = pg_loss + ref_kl_loss

A_i is the step's reward after the reward transforms (their baselines make it an advantage). D is the
constant `max_generation_len` when given (Dr. GRPO's unbiased normaliser, as in the original API) or the completion's
own length otherwise. The KL term (as in GRPO) keeps probability on moves the warm start plays, so a move whose
value shows late (folding a Jack in Kuhn Poker) is still sampled when its gradient arrives. One optimizer step
per batch, gradients accumulated over micro-batches. Data-parallel learners each take an equal shard of the batch:
pg_loss is a mean over steps, so the shards' average is the batch's; the KL term is a token mean per micro-batch
weighted by its rows, as with one learner whose micro-batches are the shards'.
"""

from __future__ import annotations

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.rl import approx_kl
from unstable.tracking import keys


class Reinforce(BaseAlgo):
    """Vanilla policy gradient on whole completions, with an optional KL penalty to the reference policy."""

    def __init__(self, max_generation_len: int | None = None, ref_kl_coef: float = 0.0):
        if ref_kl_coef < 0:
            raise ValueError(f"ref_kl_coef must be >= 0, got {ref_kl_coef}")
        self.max_generation_len = max_generation_len
        self.ref_kl_coef = ref_kl_coef

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch (this learner's shard of it)."""
        steps = policy.shard(steps)
        n = len(steps)
        pg_loss_total, ref_kl_total = 0.0, 0.0
        for batch in self.prepare_batch(steps, policy):
            logp = policy.forward(batch).logprobs  # (b, L-1)
            policy.track_ratios(logp, batch)
            share = len(batch.steps) / n
            pg_loss = self.loss(logp, batch, n)
            ref_kl = self.reference_kl(logp, batch, policy)
            ref_kl_loss = self.ref_kl_coef * share * ref_kl
            (pg_loss + ref_kl_loss).backward()
            pg_loss_total += pg_loss.item()
            ref_kl_total += share * ref_kl.item()
        grad_norm = policy.optimizer_step()
        ref_kl_loss_total = self.ref_kl_coef * ref_kl_total
        return {
            keys.LOSS: pg_loss_total + ref_kl_loss_total,
            keys.PG_LOSS: pg_loss_total,
            keys.REF_KL: ref_kl_total,
            keys.REF_KL_LOSS: ref_kl_loss_total,
            keys.GRAD_NORM: grad_norm,
        }

    def reference_kl(self, logp: torch.Tensor, batch: TokenBatch, policy: TrainablePolicy) -> torch.Tensor:
        """KL(pi || pi_ref) over the micro-batch's completion tokens; 0 (no reference pass) when ref_kl_coef is 0."""
        if not self.ref_kl_coef:
            return torch.zeros(())
        return approx_kl(policy.reference_logprobs(batch), logp, batch.completion_mask)

    def loss(self, logp: torch.Tensor, batch: TokenBatch, n: int) -> torch.Tensor:
        """This micro-batch's share of the pg_loss over `n` steps, with A_i = `batch.rewards`."""
        seq_logp = normalized_sum(logp, batch.completion_mask, self.max_generation_len)  # (b,)
        return -(batch.rewards * seq_logp).sum() / n
