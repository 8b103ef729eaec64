"""Masked statistics over padded batches and a running normaliser for rewards, returns or advantages."""

from __future__ import annotations

import torch
from torch import Tensor


def _valid(x: Tensor, mask: Tensor | None) -> Tensor:
    """`mask` as a bool tensor shaped like `x` (all True when None)."""
    if mask is None:
        return torch.ones_like(x, dtype=torch.bool)
    return mask.to(torch.bool).expand_as(x)


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of `x` over the entries where `mask` is true (all of `x` when None), over `dim` or everything.

    Padded entries may hold anything, NaN included: they are replaced by 0 before summing. A slice with no
    valid entry has mean 0.
    """
    valid = _valid(x, mask)
    total = torch.where(valid, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / valid.sum().clamp_min(1)
    return total.sum(dim) / valid.sum(dim).clamp_min(1)


def masked_whiten(x: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """`(x - mean) / std` with the mean and (population) std taken over the valid entries; padding becomes 0."""
    valid = _valid(x, mask)
    mean = masked_mean(x, valid)
    var = masked_mean((x - mean) ** 2, valid)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(valid, whitened, torch.zeros_like(x))


class RunningMeanStd(torch.nn.Module):
    """Scalar mean and variance of everything seen so far, used to normalise and clip new values.

    With `momentum=None` the statistics are exact over all updates (Chan et al.'s parallel merge); with a
    `momentum` in (0, 1] they are an exponential moving average that gives each new batch that weight.
    The statistics are buffers, so `state_dict`/`load_state_dict` save and restore them.
    """

    def __init__(self, momentum: float | None = None, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        self.momentum = momentum
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor, mask: Tensor | None = None) -> None:
        """Fold the valid entries of `x` into the statistics (a batch with none changes nothing)."""
        values = x.detach().to(torch.float64)[_valid(x, mask)]
        n = values.numel()
        if n == 0:
            return
        batch_mean = values.mean()
        batch_var = values.var(unbiased=False)
        delta = batch_mean - self.mean
        if self.count == 0:
            self.mean.copy_(batch_mean)
            self.var.copy_(batch_var)
        elif self.momentum is None:
            total = self.count + n
            self.mean += delta * n / total
            self.var.copy_((self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total)
        else:
            m = self.momentum
            self.mean += m * delta
            self.var.copy_((1 - m) * self.var + m * batch_var + m * (1 - m) * delta**2)
        self.count += n

    def normalize(self, x: Tensor) -> Tensor:
        """`(x - mean) / std`, clipped to ±`clip`, in `x`'s dtype."""
        std = torch.sqrt(self.var + self.eps)
        return ((x - self.mean) / std).clamp(-self.clip, self.clip).to(x.dtype)
