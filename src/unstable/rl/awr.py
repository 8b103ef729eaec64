"""Advantage-weighted regression: exponentiated, clipped, self-normalised advantages as weights on log-likelihood."""

from __future__ import annotations

import torch
from torch import Tensor

from unstable.rl.normalize import RunningMeanStd, _valid, masked_mean


@torch.no_grad()
def awr_weights(advantages: Tensor, temperature: float, clip: float = 8.0, mask: Tensor | None = None) -> Tensor:
    """Detached AWR weights `exp(A / temperature)`, self-normalised so the N valid weights sum to N.

    The exponent is clipped at `clip` (so before normalisation no weight exceeds `e**clip`); a NaN or +inf
    exponent is set to `clip` and a -inf one gives weight 0. Padded entries get weight 0. If every valid weight
    is 0 (or there is none) all weights are 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    valid = _valid(advantages, mask)
    exponent = torch.nan_to_num(advantages / temperature, nan=clip, posinf=clip).clamp(max=clip)
    weights = torch.where(valid, torch.exp(exponent), torch.zeros_like(exponent))
    total = weights.sum()
    if total == 0:
        return weights
    return weights * (valid.sum() / total)


@torch.no_grad()
def normalized_awr_weights(
    advantages: Tensor, temperature: float, clip: float, stats: RunningMeanStd | None, mask: Tensor | None = None
) -> Tensor:
    """`awr_weights` of the advantages normalised by the running `stats` (first updated with them); raw if None."""
    if stats is not None:
        stats.update(advantages, mask)
        advantages = stats.normalize(advantages)
    return awr_weights(advantages, temperature, clip, mask)


def weighted_nll_loss(logp: Tensor, weights: Tensor, mask: Tensor | None = None) -> Tensor:
    """Masked mean of `-weights * logp`: the AWR policy loss (weights are treated as constants)."""
    return masked_mean(-weights.detach() * logp, mask)
