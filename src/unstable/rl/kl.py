"""KL between the trained and the sampling policy, and a Lagrange multiplier that holds it near a target."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor

from unstable.rl.normalize import _valid, masked_mean


def approx_kl(logp_new: Tensor, logp_old: Tensor, mask: Tensor | None = None) -> Tensor:
    """Masked mean of the k3 estimator of KL(old || new) on tokens sampled from the old policy.

    With `r = p_new(x) / p_old(x)` the per-token estimate is `(r - 1) - log r`: unbiased (E_old[r] = 1), never
    negative, and 0 exactly when the two log-probabilities agree (Schulman, "Approximating KL divergence").
    Differentiable in both arguments.
    """
    valid = _valid(logp_new, mask)
    log_ratio = torch.where(valid, logp_new - logp_old, torch.zeros_like(logp_new))
    return masked_mean(torch.expm1(log_ratio) - log_ratio, valid)


class KLController(torch.nn.Module):
    """A KL penalty coefficient trained as a Lagrange multiplier for the constraint `KL <= target`.

    The coefficient is stored as its log and stepped by its own Adam optimizer on `coef * (target - kl)`, so it
    grows while the measured KL is above the target and shrinks while it is below; it is then clamped to
    `[min_coef, max_coef]`. Its parameter must not be handed to any other optimizer. `state_dict` carries the
    coefficient and the optimizer's state.
    """

    def __init__(
        self, init_coef: float = 0.1, min_coef: float = 0.01, max_coef: float = 100.0, lr: float = 0.01
    ) -> None:
        super().__init__()
        if not 0 < min_coef <= init_coef <= max_coef:
            raise ValueError(f"need 0 < min_coef <= init_coef <= max_coef, got {min_coef}, {init_coef}, {max_coef}")
        self.min_coef = min_coef
        self.max_coef = max_coef
        self.log_coef = torch.nn.Parameter(torch.tensor(math.log(init_coef), dtype=torch.float64))
        self.optimizer = torch.optim.Adam([self.log_coef], lr=lr)

    @property
    def coef(self) -> float:
        """The current penalty coefficient."""
        return math.exp(self.log_coef.item())

    def update(self, kl_value: float | Tensor, target: float) -> float:
        """Take one step towards `kl_value == target` and return the new coefficient (max if KL is not finite)."""
        kl = float(kl_value)
        if not math.isfinite(kl):
            with torch.no_grad():
                self.log_coef.fill_(math.log(self.max_coef))
            return self.coef
        self.optimizer.zero_grad()
        loss = self.log_coef.exp() * (target - kl)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            self.log_coef.clamp_(math.log(self.min_coef), math.log(self.max_coef))
        return self.coef

    def get_extra_state(self) -> dict[str, Any]:
        """The optimizer's state, saved alongside the coefficient by `state_dict`."""
        return self.optimizer.state_dict()

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the optimizer's state on `load_state_dict`."""
        self.optimizer.load_state_dict(copy.deepcopy(state))  # Adam would otherwise share the source's tensors
