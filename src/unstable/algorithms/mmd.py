"""Magnetic mirror descent (Sokota et al. 2022) on sampled moves: the moves made where their player saw the same
thing (one prompt: in an imperfect-information game, one information set) are pulled toward the policy that one
mirror-descent step with a magnet gives there, by a weighted log-likelihood (the cross-entropy from that target),
instead of a policy-gradient step.

    Q(s, a)    = the mean reward of the batch's moves a at prompt s         (their returns: no sampling transform)
    target(a)  proportional to  mu(a)^(1/(1+alpha*eta)) exp(eta Q(s, a)/(1+alpha*eta)) rho(a)^(alpha*eta/(1+alpha*eta))
                                                                            over the distinct moves sampled at s
    loss       = -(1/N) sum_s n_s sum_a target(a) log pi(a | s)            (n_s moves at s, N in the batch)

mu is the policy that sampled the moves (their recorded log-probs), rho the magnet: the reference policy (the warm
start) with weight `alpha`, a temperature in the rewards' units (chips); `eta` is the mirror step. A prompt where one
move only was sampled has no target the batch can tell (the others' values are unknown) and is left out; vines
(`collector.vines`) sample several moves at each decision. In exact play, with a fixed magnet, the iterates converge
to the magnet's regularised equilibrium (the last iterate, not only the average), where self-play policy gradient
cycles; `experiments/kuhn_dynamics.py` measures this loss on Kuhn Poker's table. The weights are computed on the
whole batch before data-parallel learners take their shards.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import replace
from itertools import chain

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.algorithms.batching import completion_totals
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class MagneticMirrorDescent(BaseAlgo):
    """One optimizer step toward each prompt's magnetic mirror descent target; see the module docstring."""

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
        return {
            keys.LOSS: loss_total,
            keys.PG_LOSS: loss_total,
            keys.GRAD_NORM: grad_norm,
            keys.AWR_WEIGHT_MAX: max(weights),  # how far the targets moved from the sampling policy
            keys.GROUPED_FRACTION: sum(w > 0 for w in weights) / len(weights),  # moves at a prompt with a target
        }

    def magnet_logprobs(self, steps: list[Step], policy: TrainablePolicy) -> list[float]:
        """Each step's completion log-prob under the magnet (the reference policy) where its prompt has two or more
        distinct moves; 0 elsewhere (such steps have no target) and everywhere without a magnet."""
        scores = [0.0] * len(steps)
        if not self.alpha:
            return scores
        grouped = [index for by_move in contested_moves(steps) for index in chain(*by_move.values())]
        batches = policy.micro_batches([steps[i] for i in grouped])
        for index, score in zip(grouped, completion_totals(batches, policy.reference_logprobs, len(grouped))):
            scores[index] = score
        return scores

    def target_weights(self, steps: list[Step], magnet_logprobs: list[float]) -> list[float]:
        """Each step's weight n_s target(a) / n_(s,a) (the module docstring's loss as a weighted log-likelihood);
        0 at a prompt where one distinct move was sampled."""
        weights = [0.0] * len(steps)
        for by_move in contested_moves(steps):
            exponents = {move: self._exponent(steps, magnet_logprobs, indices) for move, indices in by_move.items()}
            top = max(exponents.values())
            total = sum(math.exp(x - top) for x in exponents.values())
            size = sum(map(len, by_move.values()))
            for move, indices in by_move.items():
                for index in indices:
                    weights[index] = size * math.exp(exponents[move] - top) / total / len(indices)
        return weights

    def _exponent(self, steps: list[Step], magnet_logprobs: list[float], indices: list[int]) -> float:
        """log target(a) up to the prompt's constant, for the move the steps at `indices` made."""
        step_size = self.alpha * self.eta
        sampled = statistics.fmean(sum(steps[i].behaviour_logprobs) for i in indices)
        value = statistics.fmean(steps[i].reward for i in indices)
        magnet = statistics.fmean(magnet_logprobs[i] for i in indices)
        return (sampled + self.eta * value + step_size * magnet) / (1 + step_size)


def contested_moves(steps: list[Step]) -> list[dict[tuple, list[int]]]:
    """For each prompt where two or more distinct moves (completion tokens) were made, the steps' indices by move,
    in the steps' order."""
    moves: dict[tuple, dict[tuple, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, step in enumerate(steps):
        moves[step.prompt_token_ids][step.completion_token_ids].append(index)
    return [by_move for by_move in moves.values() if len(by_move) > 1]
