"""The algorithm interface: an algorithm owns the math and its update schedule, nothing else.

An algorithm gets a batch of steps and a `TrainablePolicy` (the learner, seen through that small interface):
it asks for micro-batches and log-probs, calls `backward` on its own losses and decides when to call
`optimizer_step()` (once per batch for REINFORCE, several epochs of minibatches for PPO). As in the original API,
`prepare_batch` turns steps into tensors and `update` computes the loss and steps. Algorithms never import
the learner.

With several data-parallel learners every rank's `update` gets the whole batch and trains on its
`policy.shard(...)` of each part it steps on (the batch, a minibatch); the gradients are averaged in
`optimizer_step`, so the update is one learner's when the loss is a mean over steps. An algorithm whose update
cannot be split that way refuses in `check_num_learners`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, Literal

import torch

from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class BaseAlgo(ABC):
    """Base class for learning algorithms; every `update` reports `learner/loss` and its named terms."""

    def initialize(self, policy: TrainablePolicy) -> None:
        """Called once after the model and optimizer exist (e.g. to add a value head's parameters)."""
        return None

    def prepare_batch(self, steps: list[Step], policy: TrainablePolicy) -> list[TokenBatch]:
        """Steps to collated micro-batches on the policy's device (override to change the packing)."""
        return policy.micro_batches(steps)

    @abstractmethod
    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """Train on one batch of steps; return metrics named by `unstable.tracking.keys`."""

    def check_num_learners(self, num_learners: int) -> None:
        """Raise ValueError, saying why, when `num_learners` data-parallel learners cannot split this algorithm's
        update into equal shards whose averaged gradients equal one learner's on the whole batch."""
        return None

    def check_sharding(self) -> None:
        """Raise ValueError, saying why, when this algorithm cannot train a model sharded over the learners
        (`learner.sharding: fsdp`), whose every forward pass all ranks make together."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What the algorithm learned or counted beyond the model (value heads, multipliers, RNG); none here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output (after `initialize`)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got keys {sorted(state)}")


def normalized_sum(token_values: torch.Tensor, completion_mask: torch.Tensor, max_generation_len: int | None):
    """Each row's sum of `token_values` over its completion tokens divided by D, `(B,)`.

    D is the constant `max_generation_len` when given (Dr. GRPO's length-unbiased normaliser, as in the original API)
    or the row's own completion length otherwise.
    """
    total = (token_values * completion_mask).sum(-1)  # (B,)
    if max_generation_len is not None:
        return total / max_generation_len
    return total / completion_mask.sum(-1).clamp(min=1.0)


def restore_rng(rng: random.Random, state) -> None:
    """Set `rng` to a saved `getstate()`, also when the state came back from JSON as nested lists."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


IMPORTANCE_LEVELS = ("token", "sequence")


def check_importance(cap: float | None, level: str) -> None:
    """Raise ValueError, saying why, for an importance cap or level `importance_weights` cannot use."""
    if cap is not None and cap < 1.0:
        raise ValueError(f"importance_cap must be >= 1 (on-policy tokens have ratio 1) or None (off), got {cap}")
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"importance_level must be one of {IMPORTANCE_LEVELS}, got {level!r}")


def importance_weights(
    logp: torch.Tensor, batch: TokenBatch, cap: float | None, level: Literal["token", "sequence"] = "token"
) -> tuple[torch.Tensor | None, float]:
    """Truncated importance weights `min(pi / mu, cap)` of the completion tokens, without gradient, `(B, L-1)`, and
    how many completion tokens were capped; None and 0 when `cap` is None (no correction).

    mu is the sampling policy (`batch.behaviour_logprobs`): a step sampled by an older policy version (or by an
    engine whose numerics differ) is reweighted toward the policy being trained, as in truncated importance
    sampling (TIS). `level` 'token' takes each token's own ratio; 'sequence' one ratio per row, the product over its
    completion tokens, given to every token of the row. Zero outside the completion.
    """
    if cap is None:
        return None, 0.0
    mask = batch.completion_mask
    log_ratio = (logp.detach() - batch.behaviour_logprobs) * mask  # (B, L-1)
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)  # (B, L-1)
    ratio = torch.exp(log_ratio)  # (B, L-1); inf where it overflows, which the cap takes
    capped = float(((ratio > cap) * mask).sum())
    return ratio.clamp(max=cap) * mask, capped


def importance_metrics(cap: float | None, capped: float, tokens: float) -> dict[str, float]:
    """`learner/importance_capped_fraction` of an update that capped `capped` of its `tokens` completion tokens;
    nothing when the correction is off (`cap` None)."""
    if cap is None:
        return {}
    return {keys.IMPORTANCE_CAPPED_FRACTION: capped / max(tokens, 1.0)}
