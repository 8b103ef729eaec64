"""Magnetic mirror descent (Sokota et al. 2022) on sampled groups: each decision state's moves are pulled toward
the policy that one mirror-descent step with a magnet would give, by a weighted log-likelihood (as AWR fits its
target), instead of a policy-gradient step.

    target(a | s) proportional to  mu(a | s)^(1/(1+alpha*eta)) * exp(eta * Q(s, a) / (1+alpha*eta))
                                   * rho(a | s)^(alpha*eta/(1+alpha*eta))
    u_i  = (eta * r_i + alpha * eta * (log rho(a_i) - log mu(a_i))) / (1 + alpha * eta)
    w_i  = exp(u_i) / mean_{j in g(i)} exp(u_j)                  (target / mu, normalised over the group's samples)
    loss = -(1/N) sum_i w_i * log pi(a_i | s_i)                   (the cross-entropy from the target to pi)

mu is the policy that sampled the moves (their recorded log-probs), rho the magnet: the reference policy (the warm
start) with weight `alpha`, a temperature in the rewards' units; `eta` is the mirror step. r_i must be an estimate
of Q(s, a_i) in those units (vines' `BaselineByGroup(by_action: true)`, no z-score: a constant shift per group
cancels in w). A group is the moves sampled from one copied state (`Step.group_id`); a step alone in its group gets
weight 1. In exact play, with a fixed magnet, the iterates converge to the magnet's regularised equilibrium (the
last iterate, not only the average), where plain self-play policy gradient cycles; `experiments/kuhn_dynamics.py`
measures that on Kuhn Poker's table. The weights are computed on the whole batch before data-parallel learners
take their shards, so every group keeps its normaliser however the batch is split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import replace

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class MagneticMirrorDescent(BaseAlgo):
    """One optimizer step toward each state's magnetic mirror descent target; see the module docstring."""

    def __init__(self, eta: float = 1.0, alpha: float = 0.1):
        if not (math.isfinite(eta) and eta > 0):
            raise ValueError(f"eta (the mirror step) must be a finite number > 0, got {eta}")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha (the magnet's weight) must be a finite number >= 0, got {alpha}")
        self.eta = eta
        self.alpha = alpha

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch (this learner's shard of it) on the target weights."""
        weights = self.target_weights(steps, self.magnet_logprobs(steps, policy))
        steps = policy.shard([replace(step, reward=w) for step, w in zip(steps, weights)])
        n = len(steps)
        loss_total = 0.0
        for batch in policy.micro_batches(steps):
            logp = policy.forward(batch).logprobs  # (b, L-1)
            policy.track_ratios(logp, batch)
            loss = -(batch.rewards * normalized_sum(logp, batch.completion_mask, 1)).sum() / n
            loss.backward()
            loss_total += loss.item()
        grad_norm = policy.optimizer_step()
        # the largest weight says how far the targets moved from the sampling policy, as AWR's does
        return {
            keys.LOSS: loss_total,
            keys.PG_LOSS: loss_total,
            keys.GRAD_NORM: grad_norm,
            keys.AWR_WEIGHT_MAX: max(weights),
        }

    def magnet_logprobs(self, steps: list[Step], policy: TrainablePolicy) -> list[float]:
        """Each step's completion log-prob under the magnet (the reference policy); zeros without a magnet."""
        if not self.alpha:
            return [0.0] * len(steps)
        totals = torch.zeros(len(steps))
        with torch.no_grad():
            for batch in policy.micro_batches(steps):
                sums = (policy.reference_logprobs(batch) * batch.completion_mask).sum(-1)  # (b,)
                totals[batch.rows] = sums.float().cpu()
        return totals.tolist()

    def target_weights(self, steps: list[Step], magnet_logprobs: list[float]) -> list[float]:
        """w_i of the module docstring for every step, normalised within its group over the batch."""
        step_size = self.alpha * self.eta
        exponents = [
            (self.eta * step.reward + step_size * (magnet - sum(step.behaviour_logprobs))) / (1 + step_size)
            for step, magnet in zip(steps, magnet_logprobs)
        ]
        groups: dict[Hashable, list[int]] = defaultdict(list)
        for index, step in enumerate(steps):
            groups[step.group_id if step.group_id is not None else ("alone", index)].append(index)
        weights = [1.0] * len(steps)
        for members in groups.values():
            top = max(exponents[i] for i in members)
            scaled = [math.exp(exponents[i] - top) for i in members]
            mean = sum(scaled) / len(scaled)
            for i, value in zip(members, scaled):
                weights[i] = value / mean
        return weights
