"""The interface an algorithm trains through: the learner implements it, algorithms depend only on it.

An algorithm never sees the learner object, its model or its optimizer. It asks for micro-batches, runs
`forward` to get token log-probs (and, on request, decision-state encodings or token entropies), calls
`backward` on its own losses, and decides when to `optimizer_step`. This keeps the import direction one way
(records -> batching -> algorithms -> learner) and lets a test drive an algorithm with any object of this shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from unstable.algorithms.batching import TokenBatch
from unstable.records import Step


@dataclass
class PolicyOutput:
    """What one forward pass gives an algorithm; every tensor is aligned to `TokenBatch`'s targets."""

    logprobs: torch.Tensor  # (B, L-1) each target token's log-prob under its row's sampling distribution
    encodings: torch.Tensor | None = None  # (B, H) float32 hidden state at each row's decision (last prompt token)
    entropy: torch.Tensor | None = None  # (B, L-1) entropy of each next-token distribution


class TrainablePolicy(Protocol):
    """A policy model with an optimizer behind it, as the algorithms see it."""

    device: str
    hidden_size: int

    def shard(self, steps: list[Step]) -> list[Step]:
        """This learner's equal part of `steps` when data-parallel learners share them (all of `steps` for one);
        every learner's gradients are averaged in `optimizer_step`."""

    def micro_batches(self, steps: list[Step]) -> list[TokenBatch]:
        """Token-budget micro-batches of `steps` on the device; `TokenBatch.rows` index into `steps`."""

    def forward(self, batch: TokenBatch, *, encodings: bool = False, entropy: bool = False) -> PolicyOutput:
        """Token log-probs of `batch` (with gradients unless under `torch.no_grad`), plus what is asked for."""

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Token log-probs of `batch` under the frozen reference policy (the warm start, unless `move_reference`
        moved it), `(B, L-1)`, no gradient."""

    def move_reference(self, fraction: float = 1.0) -> None:
        """Move the reference `reference_logprobs` scores with `fraction` of the way to the current policy (1: make
        the current policy the reference; a moving KL anchor)."""

    def track_ratios(self, logprobs: torch.Tensor, batch: TokenBatch) -> None:
        """Record the importance ratios `exp(logprobs - behaviour)` of the batch's completion tokens."""

    def add_parameters(self, params: Iterable[torch.nn.Parameter], lr: float | None = None) -> None:
        """Train extra parameters (a value head) with the same optimizer, at `lr` if given."""

    def optimizer_step(self) -> float:
        """Average the gradients over the data-parallel learners, clip, step and zero them; return the pre-clip
        gradient norm."""
