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
move only was sampled (uncontested) has no value gap the batch can tell: with `uncontested="skip"` it is left out;
with `uncontested="magnet"` it takes the magnet's step alone, the gap taken as 0 and the moves not sampled lumped as
one (exact for two legal moves):

    t          = mu(a)^c rho(a)^(1-c) / (mu(a)^c rho(a)^(1-c) + (1-mu(a))^c (1-rho(a))^(1-c)),   c = 1/(1+alpha*eta)
    loss      += -(1/N) sum over its moves [t log pi(a | s) + (1 - t) log(1 - pi(a | s))]

so that a policy that stopped sampling a move at a prompt is still pulled back toward the magnet there until it
samples it again (with "skip" such a prompt has no gradient at all, and a policy that saturated stays there). Vines
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

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum
from unstable.algorithms.batching import completion_totals
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class MagneticMirrorDescent(BaseAlgo):
    """One optimizer step toward each prompt's magnetic mirror descent target; see the module docstring."""

    def __init__(self, eta: float = 1.0, alpha: float = 0.1, uncontested: str = "skip"):
        if not (math.isfinite(eta) and eta > 0):
            raise ValueError(f"eta (the mirror step) must be a finite number > 0, got {eta}")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha (the magnet's weight) must be a finite number >= 0, got {alpha}")
        if uncontested not in UNCONTESTED:
            raise ValueError(f"uncontested must be one of {', '.join(UNCONTESTED)}, got {uncontested!r}")
        self.eta = eta
        self.alpha = alpha
        self.uncontested = uncontested

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch (this learner's shard of it) on the target weights."""
        magnet = self.magnet_logprobs(steps, policy)
        weights = self.target_weights(steps, magnet)
        rest = self.rest_weights(steps, weights)
        contested_share = 1 - len(uncontested_moves(steps)) / len(steps)
        steps = policy.shard([replace(step, reward=w) for step, w in zip(steps, weights)])
        rest = policy.shard(rest)
        n = len(steps)
        loss_total = 0.0
        for batch in policy.micro_batches(steps):
            logp = policy.forward(batch).logprobs  # (b, L-1)
            policy.track_ratios(logp, batch)
            move_logp = normalized_sum(logp, batch.completion_mask, 1)  # (b,) log pi(a | s)
            loss = -(batch.rewards * move_logp).sum() / n
            if self.uncontested == "magnet":  # the moves not sampled at uncontested prompts
                others = torch.tensor([rest[r] for r in batch.rows.tolist()], dtype=logp.dtype, device=logp.device)
                loss = loss - (others * log_not(move_logp)).sum() / n
            loss.backward()
            loss_total += loss.item()
        grad_norm = policy.optimizer_step()
        return {
            keys.LOSS: loss_total,
            keys.PG_LOSS: loss_total,
            keys.GRAD_NORM: grad_norm,
            keys.AWR_WEIGHT_MAX: max(weights),  # how far the targets moved from the sampling policy
            keys.GROUPED_FRACTION: contested_share,  # moves at a prompt where two or more moves were sampled
        }

    def magnet_logprobs(self, steps: list[Step], policy: TrainablePolicy) -> list[float]:
        """Each step's completion log-prob under the magnet (the reference policy) where its prompt has a target: two
        or more distinct moves, or any with `uncontested="magnet"`; 0 elsewhere and everywhere without a magnet."""
        scores = [0.0] * len(steps)
        if not self.alpha:
            return scores
        prompts = contested_moves(steps, uncontested=self.uncontested == "magnet")
        grouped = [index for by_move in prompts for index in chain(*by_move.values())]
        batches = policy.micro_batches([steps[i] for i in grouped])
        for index, score in zip(grouped, completion_totals(batches, policy.reference_logprobs, len(grouped))):
            scores[index] = score
        return scores

    def target_weights(self, steps: list[Step], magnet_logprobs: list[float]) -> list[float]:
        """Each step's weight on its log pi(a | s): n_s target(a) / n_(s,a) (the module docstring's loss as a weighted
        log-likelihood); at an uncontested prompt t with `uncontested="magnet"`, else 0."""
        weights = [0.0] * len(steps)
        if self.uncontested == "magnet":
            for index in uncontested_moves(steps):
                weights[index] = self._magnet_step(steps[index], magnet_logprobs[index])
        for by_move in contested_moves(steps):
            exponents = {move: self._exponent(steps, magnet_logprobs, indices) for move, indices in by_move.items()}
            top = max(exponents.values())
            total = sum(math.exp(x - top) for x in exponents.values())
            size = sum(map(len, by_move.values()))
            for move, indices in by_move.items():
                for index in indices:
                    weights[index] = size * math.exp(exponents[move] - top) / total / len(indices)
        return weights

    def rest_weights(self, steps: list[Step], weights: list[float]) -> list[float]:
        """Each step's weight on log(1 - pi(a | s)), the moves not sampled: 1 - t at an uncontested prompt with
        `uncontested="magnet"` (`weights` holds its t), else 0."""
        rest = [0.0] * len(steps)
        if self.uncontested == "magnet":
            for index in uncontested_moves(steps):
                rest[index] = 1.0 - weights[index]
        return rest

    def _magnet_step(self, step: Step, magnet_logprob: float) -> float:
        """t: the probability of `step`'s move after the magnet's step alone, the moves not sampled lumped as one."""
        keep = 1 / (1 + self.alpha * self.eta)
        sampled = sum(step.behaviour_logprobs)
        move = keep * sampled + (1 - keep) * magnet_logprob
        not_sampled, not_magnet = log_not(torch.tensor([sampled, magnet_logprob], dtype=torch.float64)).tolist()
        others = keep * not_sampled + (1 - keep) * not_magnet
        return 1 / (1 + math.exp(others - move))

    def _exponent(self, steps: list[Step], magnet_logprobs: list[float], indices: list[int]) -> float:
        """log target(a) up to the prompt's constant, for the move the steps at `indices` made."""
        step_size = self.alpha * self.eta
        sampled = statistics.fmean(sum(steps[i].behaviour_logprobs) for i in indices)
        value = statistics.fmean(steps[i].reward for i in indices)
        magnet = statistics.fmean(magnet_logprobs[i] for i in indices)
        return (sampled + self.eta * value + step_size * magnet) / (1 + step_size)


def contested_moves(steps: list[Step], uncontested: bool = False) -> list[dict[tuple, list[int]]]:
    """For each prompt where two or more distinct moves (completion tokens) were made (every prompt with
    `uncontested`), the steps' indices by move, in the steps' order."""
    moves: dict[tuple, dict[tuple, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, step in enumerate(steps):
        moves[step.prompt_token_ids][step.completion_token_ids].append(index)
    return [by_move for by_move in moves.values() if uncontested or len(by_move) > 1]


def uncontested_moves(steps: list[Step]) -> list[int]:
    """The indices of the steps at prompts where one distinct move only was made."""
    contested = {index for by_move in contested_moves(steps) for index in chain(*by_move.values())}
    return [index for index in range(len(steps)) if index not in contested]


# log(1 - p) from log p: at p so close to 1 that float32 rounds 1 - p to 0, the gradient is cut off there
_LOG_ONE = -1e-7


def log_not(logp: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(logp)), elementwise, stable near logp = 0 (`_LOG_ONE`)."""
    return torch.log(-torch.expm1(logp.clamp(max=_LOG_ONE)))


UNCONTESTED = ("skip", "magnet")  # what a prompt where one move was sampled takes: nothing, or the magnet's step
