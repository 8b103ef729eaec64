"""V-trace value targets and advantages (IMPALA, Espeholt et al. 2018) with a lambda, over padded batches.

All functions take `(B, T)` tensors: B sequences of up to T steps (for an LLM, T is the number of decisions
in one game), right-padded, with `mask` true on the valid steps. Padded entries may hold anything, NaN
included; outputs there are 0. The step after the last valid one is valued at `bootstrap_value` (B,), the
critic's value of the state a truncated sequence stopped in (0 when the game ended there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class VTraceReturns:
    """V-trace outputs, all `(B, T)` and detached: value targets `vs`, policy-gradient `advantages`, the
    clipped importance weights `rhos` and the traces `cs` (already multiplied by lambda)."""

    vs: Tensor
    advantages: Tensor
    rhos: Tensor
    cs: Tensor


def _float(x: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` in `dtype` with padded entries set to 0."""
    x = x.to(dtype)
    return torch.where(valid, x, torch.zeros_like(x))


def _next_step(x: Tensor, bootstrap_value: Tensor, valid: Tensor) -> Tensor:
    """`x[:, t + 1]` where step t+1 is valid, else `bootstrap_value`: the value of the state after step t."""
    bootstrap = bootstrap_value.to(x.dtype)[:, None].expand_as(x)  # (B, T)
    shifted = torch.cat([x[:, 1:], bootstrap[:, :1]], dim=1)  # (B, T)
    next_valid = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1)  # (B, T)
    return torch.where(next_valid, shifted, bootstrap)


def _check_mask(valid: Tensor) -> None:
    """Raise unless every row's valid steps come before its padding."""
    if (valid[:, 1:] & ~valid[:, :-1]).any():
        raise ValueError("mask must be right-padded: no valid step may follow a padded one")


@torch.no_grad()
def vtrace(
    logp_target: Tensor,
    logp_behaviour: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    dones: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages for the target policy from steps sampled by the behaviour policy.

    With `w_t = exp(logp_target_t - logp_behaviour_t)`, `rho_t = min(w_t, rho_bar)`, `c_t = lam * min(w_t, c_bar)`
    and `V_{t+1}` the value after step t (the bootstrap value after the last valid step):

        delta_t = rho_t * (r_t + gamma * (1 - done_t) * V_{t+1} - V_t)
        vs_t    = V_t + delta_t + gamma * c_t * (1 - done_t) * (vs_{t+1} - V_{t+1})
        A_t     = rho_t * (r_t + gamma * (1 - done_t) * vs_{t+1} - V_t)

    where `vs` after the last valid step is the bootstrap value. A `done` in the middle of a row ends that
    episode: nothing flows back across it. `logp_*` are per-step (summed over a decision's tokens for an LLM).
    """
    valid = mask.to(torch.bool)
    _check_mask(valid)
    dtype = torch.promote_types(values.dtype, torch.float32)
    values = _float(values, valid, dtype)
    rewards = _float(rewards, valid, dtype)
    not_done = _float(1 - dones.to(dtype), valid, dtype)
    weights = torch.exp(_float(logp_target - logp_behaviour, valid, dtype))
    rhos = _float(weights.clamp(max=rho_bar), valid, dtype)
    cs = _float(lam * weights.clamp(max=c_bar), valid, dtype)

    next_values = _next_step(values, bootstrap_value, valid)
    deltas = rhos * (rewards + gamma * not_done * next_values - values)
    diffs = torch.zeros_like(values)  # (B, T): vs - V
    diff = torch.zeros_like(values[:, 0])  # (B,): vs_{t+1} - V_{t+1}, 0 past the last valid step
    for t in reversed(range(values.shape[1])):
        diff = deltas[:, t] + gamma * cs[:, t] * not_done[:, t] * diff
        diffs[:, t] = diff
    vs = values + diffs

    next_vs = _next_step(vs, bootstrap_value, valid)
    advantages = rhos * (rewards + gamma * not_done * next_vs - values)
    return VTraceReturns(vs=vs, advantages=advantages, rhos=rhos, cs=cs)


@torch.no_grad()
def discounted_returns(rewards: Tensor, dones: Tensor, gamma: float, mask: Tensor) -> Tensor:
    """Monte-Carlo return-to-go `G_t = r_t + gamma * (1 - done_t) * G_{t+1}`, 0 after each row's last valid step."""
    valid = mask.to(torch.bool)
    _check_mask(valid)
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    rewards = _float(rewards, valid, dtype)
    not_done = _float(1 - dones.to(dtype), valid, dtype)
    returns = torch.zeros_like(rewards)  # (B, T)
    running = torch.zeros_like(rewards[:, 0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * not_done[:, t] * running
        returns[:, t] = running
    return returns
