"""REINFORCE: raise the log-likelihood of each completion in proportion to its (transformed) reward, optionally
held near a reference policy, with truncated importance weights for samples of older policies.

    w_it        = min(pi(a_it | ...) / mu(a_it | ...), importance_cap)   (no gradient; 1 with importance_cap None)
    pg_loss     = -(1/N) sum_i A_i * sum_t w_it log pi(a_it | s_i, a_i<t) / D
    ref_kl_loss = ref_kl_coef * KL(pi || pi_ref)      (k3 estimate on the sampled tokens, mean over tokens)
    loss        = pg_loss + ref_kl_loss

A_i is the step's reward after the reward transforms (their baselines make it an advantage). D is the
constant `max_generation_len` when given (Dr. GRPO's unbiased normaliser, as in the original API) or the completion's
own length otherwise. mu is the policy that sampled the step: in an asynchronous run a step can be several policy
versions old (`learner.max_staleness`), and w corrects its gradient toward the current policy's, truncated at the
cap so that one unlikely token cannot dominate a batch (TIS; `importance_level` 'sequence' uses one ratio per
completion). The KL term (as in GRPO) keeps probability on moves the reference plays, so a move whose value shows
late (folding a Jack in Kuhn Poker) is still sampled when its gradient arrives. The reference is the warm start;
with `ref_reset_every` M it becomes the current policy every M updates (a moving anchor, as R-NaD's regularisation
policy), which damps the cycling of plain self-play without holding the policy near its start for ever. With
`ref_mix` f it moves only the fraction f of the way there, in weight space, every M updates (every update when M is
unset: an exponential average of the policy, magnetic mirror descent's moving magnet); f may be a schedule, as below.
`ref_kl_coef` may be a schedule instead of one number: points `[[update, coef], ...]`, the coefficient linear between
them and flat outside (an annealed magnet, as in magnetic mirror descent: the anchor's weight is the temperature of the
regularised equilibrium self-play settles in, so a strong anchor that lets the policy find the moves' values is
lowered as it goes).
One optimizer step per batch, gradients accumulated over micro-batches. Data-parallel learners each take an equal
shard of the batch: pg_loss is a mean over steps, so the shards' average is the batch's; the KL term is a token mean
per micro-batch weighted by its rows, as with one learner whose micro-batches are the shards'.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from unstable.algorithms.base import BaseAlgo, check_importance, importance_metrics, importance_weights, normalized_sum
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.rl import approx_kl
from unstable.settings import is_number
from unstable.tracking import keys


class Reinforce(BaseAlgo):
    """Vanilla policy gradient on whole completions, with an optional KL penalty to the reference policy."""

    def __init__(
        self,
        max_generation_len: int | None = None,
        ref_kl_coef: float | list[list[float]] = 0.0,
        ref_reset_every: int | None = None,
        importance_cap: float | None = None,
        importance_level: Literal["token", "sequence"] = "token",
        ref_mix: float | list[list[float]] | None = None,
    ):
        self.ref_kl_schedule = schedule_points(ref_kl_coef, "ref_kl_coef")
        self.ref_mix_schedule = None if ref_mix is None else schedule_points(ref_mix, "ref_mix", maximum=1.0)
        if ref_reset_every is not None and ref_reset_every < 1:
            raise ValueError(f"ref_reset_every must be >= 1 or None (the reference stays put), got {ref_reset_every}")
        moved_by = "ref_reset_every" if ref_reset_every is not None else "ref_mix" if ref_mix is not None else None
        if moved_by and not any(coef for _, coef in self.ref_kl_schedule):
            raise ValueError(f"{moved_by} moves the KL reference, which only a ref_kl_coef above 0 uses: set both")
        check_importance(importance_cap, importance_level)
        self.max_generation_len = max_generation_len
        self.ref_reset_every = ref_reset_every or (1 if ref_mix is not None else None)  # ref_mix alone: every update
        self.importance_cap = importance_cap
        self.importance_level = importance_level
        self.updates = 0  # optimizer steps taken, which time the anchor's resets

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch (this learner's shard of it)."""
        steps = policy.shard(steps)
        n = len(steps)
        ref_kl_coef = self.ref_kl_coef()
        pg_loss_total, ref_kl_total, capped, tokens = 0.0, 0.0, 0.0, 0.0
        for batch in self.prepare_batch(steps, policy):
            logp = policy.forward(batch).logprobs  # (b, L-1)
            policy.track_ratios(logp, batch)
            share = len(batch.steps) / n
            weights, batch_capped = importance_weights(logp, batch, self.importance_cap, self.importance_level)
            pg_loss = self.loss(logp, batch, n, weights)
            ref_kl = self.reference_kl(logp, batch, policy, ref_kl_coef)
            ref_kl_loss = ref_kl_coef * share * ref_kl
            (pg_loss + ref_kl_loss).backward()
            pg_loss_total += pg_loss.item()
            ref_kl_total += share * ref_kl.item()
            capped += batch_capped
            tokens += float(batch.completion_mask.sum())
        grad_norm = policy.optimizer_step()
        self.move_anchor(policy)
        ref_kl_loss_total = ref_kl_coef * ref_kl_total
        return {
            keys.LOSS: pg_loss_total + ref_kl_loss_total,
            keys.PG_LOSS: pg_loss_total,
            keys.REF_KL: ref_kl_total,
            keys.REF_KL_LOSS: ref_kl_loss_total,
            keys.REF_KL_COEF: ref_kl_coef,
            keys.GRAD_NORM: grad_norm,
        } | importance_metrics(self.importance_cap, capped, tokens)

    def move_anchor(self, policy: TrainablePolicy) -> None:
        """Count the update; every `ref_reset_every` updates move the KL reference `ref_mix` of the way to the
        current policy (all the way without `ref_mix`)."""
        self.updates += 1
        if not self.ref_reset_every or self.updates % self.ref_reset_every:
            return
        fraction = 1.0 if self.ref_mix_schedule is None else scheduled(self.ref_mix_schedule, self.updates)
        if fraction > 0:
            policy.move_reference(fraction)

    def ref_kl_coef(self) -> float:
        """The KL coefficient of the next update: `ref_kl_coef`'s schedule at the updates taken so far."""
        return scheduled(self.ref_kl_schedule, self.updates)

    def reference_kl(self, logp: torch.Tensor, batch: TokenBatch, policy: TrainablePolicy, coef: float) -> torch.Tensor:
        """KL(pi || pi_ref) over the micro-batch's completion tokens; 0 (no reference pass) when `coef` is 0."""
        if not coef:
            return torch.zeros(())
        return approx_kl(policy.reference_logprobs(batch), logp, batch.completion_mask)

    def loss(self, logp: torch.Tensor, batch: TokenBatch, n: int, weights: torch.Tensor | None = None) -> torch.Tensor:
        """This micro-batch's share of the pg_loss over `n` steps, with A_i = `batch.rewards` and each token's
        log-prob scaled by its importance weight when given."""
        weighted = logp if weights is None else logp * weights
        seq_logp = normalized_sum(weighted, batch.completion_mask, self.max_generation_len)  # (b,)
        return -(batch.rewards * seq_logp).sum() / n

    def check_sharding(self) -> None:
        """Refused with a moving anchor: the reference copy of a sharded model is not sharded."""
        if self.ref_reset_every:
            raise ValueError(
                "ref_reset_every and ref_mix cannot move the reference of a sharded model (learner.sharding: fsdp); "
                "leave them unset or use learner.sharding: none"
            )

    def state_dict(self) -> dict[str, Any]:
        """The number of updates taken (when the anchor moves next, where the KL schedule is)."""
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the update count (a state saved before it was kept counts from 0)."""
        self.updates = int(state.get("updates", 0))


def schedule_points(value: float | list[list[float]], name: str, maximum: float = math.inf) -> list[tuple[int, float]]:
    """The setting `name` as `(update, value)` points: one number is a flat schedule; a list of `[update, value]`
    pairs must have updates >= 0 in increasing order and values from 0 to `maximum`."""
    if is_number(value):
        points = [[0, value]]
    elif isinstance(value, list | tuple) and value:
        points = value
    else:
        raise ValueError(f"{name} must be a number or a list of [update, value] points, got {value!r}")
    schedule = []
    for point in points:
        if not (isinstance(point, list | tuple) and len(point) == 2 and all(is_number(x) for x in point)):
            raise ValueError(f"each {name} point must be [update, value], got {point!r}")
        update, number = point
        if not math.isfinite(number) or not 0 <= number <= maximum:
            bound = f"from 0 to {maximum:g}" if math.isfinite(maximum) else ">= 0"
            raise ValueError(f"{name} must be a finite number {bound}, got {number}")
        if update < 0 or int(update) != update or (schedule and update <= schedule[-1][0]):
            raise ValueError(f"{name}'s updates must be whole numbers >= 0, increasing: got {value!r}")
        schedule.append((int(update), float(number)))
    return schedule


def scheduled(schedule: list[tuple[int, float]], update: int) -> float:
    """The value of a piecewise-linear `schedule` at `update` (its first value before it, its last after it)."""
    if update <= schedule[0][0]:
        return schedule[0][1]
    for (u0, c0), (u1, c1) in zip(schedule, schedule[1:]):
        if update <= u1:
            return c0 + (c1 - c0) * (update - u0) / (u1 - u0)
    return schedule[-1][1]
