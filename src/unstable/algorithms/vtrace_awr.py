"""V-trace advantages, an AWR policy loss, a Lagrangian KL penalty and a value function fitted mostly on cached
state encodings: ubrl's algorithm, rebuilt from its README.

Decisions are one-step episodes. Batches are random samples of steps and a step's reward is already its game's
outcome plus shaping (a return, not a per-turn reward), so each decision is treated as an episode that ends
with that reward; traces across a game's decisions would need the whole game in the batch and per-turn
rewards. With w_i = exp(sum_t logp_it - sum_t logp_behaviour_it) the decision's importance weight (over its
kept completion tokens), `unstable.rl.vtrace` on length-1 sequences with done=1 gives

    rho_i = min(w_i, vtrace_rho_max),    vs_i = V_i + rho_i (r_i - V_i),    A_i = rho_i (r_i - V_i)

One update:
  1. cache: one no-grad forward pass gives each step's decision-state encoding h_i (the hidden state at its
     last prompt token) and its w_i;
  2. value pre-training: `vf_pre_epochs` epochs of value-only minibatch steps on the cached h_i, the targets vs_i
     recomputed from the current head each epoch;
  3. advantages A_i from the fitted head, normalised by running statistics; AWR weights
     `awr_weights(A, awr_temperature, awr_exponent_clip)`, self-normalised to mean 1 over the batch;
  4. policy: `policy_epochs` over shuffled minibatches of `minibatch_size` steps, one optimizer step each:
         awr_loss   = (1/N) sum_i -weight_i * sum_t logp_it / D
         kl_loss    = kl_coef * KL(behaviour || current)         (k3 estimate, mean over tokens)
         value_loss = vf_loss_coef * (1/N) sum_i (V(h_i) - vs_i)^2      (live h_i: shapes the encodings too)
         loss       = awr_loss + kl_loss + value_loss
     where kl_coef is a Lagrange multiplier (`KLController`) stepped after each minibatch so the measured KL
     is held near `kl_target`. Like PPO's clip, the KL is measured against the behaviour policy;
  5. value post-training: `vf_post_epochs` more value-only epochs on the (now slightly stale) cache.
So the value function gets vf_pre_epochs + vf_post_epochs cheap epochs for 1 + policy_epochs full forward passes.
D as in `Reinforce`. The arguments that `unstable.rl.TrainerConfig` also has carry its names (the same concept,
the same name); the math is `unstable.rl`'s (`vtrace`, `normalized_awr_weights`, `weighted_nll_loss`,
`approx_kl`, `KLController`), not a copy.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from unstable.algorithms.base import BaseAlgo, normalized_sum, restore_rng
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.algorithms.value import attach_value_head
from unstable.records import Step
from unstable.rl import (
    KLController,
    RunningMeanStd,
    VTraceReturns,
    approx_kl,
    normalized_awr_weights,
    vtrace,
    weighted_nll_loss,
)
from unstable.tracking import keys


class VTraceAWR(BaseAlgo):
    """Off-policy actor-critic: V-trace advantages, AWR weights, a KL multiplier, value fitting on a cache."""

    def __init__(
        self,
        awr_temperature: float = 1.0,
        awr_exponent_clip: float = 8.0,
        vtrace_rho_max: float = 1.0,
        kl_target: float = 0.1,
        kl_coef_init: float = 0.1,
        kl_coef_lr: float = 0.01,
        vf_loss_coef: float = 0.1,
        vf_pre_epochs: int = 3,
        vf_post_epochs: int = 3,
        vf_minibatch_size: int = 64,
        vf_lr: float | None = 1e-3,
        vf_hidden_sizes: Sequence[int] = (128,),
        policy_epochs: int = 1,
        minibatch_size: int | None = None,
        normalize_advantages: bool = True,
        max_generation_len: int | None = None,
        seed: int = 0,
        **old_names: Any,
    ):
        refuse_old_names(old_names)
        self.awr_temperature = awr_temperature
        self.awr_exponent_clip = awr_exponent_clip
        self.vtrace_rho_max = vtrace_rho_max
        self.kl_target = kl_target
        self.vf_loss_coef = vf_loss_coef
        self.vf_pre_epochs = vf_pre_epochs
        self.vf_post_epochs = vf_post_epochs
        self.vf_minibatch_size = vf_minibatch_size
        self.vf_lr = vf_lr
        self.vf_hidden_sizes = tuple(vf_hidden_sizes)
        self.policy_epochs = policy_epochs
        self.minibatch_size = minibatch_size
        self.normalize_advantages = normalize_advantages
        self.max_generation_len = max_generation_len
        self.kl_controller = KLController(init_coef=kl_coef_init, lr=kl_coef_lr)
        self.advantage_stats = RunningMeanStd(momentum=0.01)
        self.rng = random.Random(seed)
        self.value_head = None

    def initialize(self, policy: TrainablePolicy) -> None:
        """Create the value head and hand its parameters to the policy's optimizer."""
        self.value_head = attach_value_head(policy, self.vf_hidden_sizes, self.vf_lr)

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """Cache, fit values, weigh, update the policy, fit values again (see the module docstring)."""
        cache = self._cache(steps, policy)
        vf_pre_loss = self._fit_values(cache, policy, self.vf_pre_epochs)
        returns, weights = self._weights(cache)
        logs = self._policy_epochs(steps, cache, returns.vs[:, 0], weights, policy)
        vf_post_loss = self._fit_values(cache, policy, self.vf_post_epochs)
        return logs | {
            keys.VF_PRE_LOSS: vf_pre_loss,
            keys.VF_POST_LOSS: vf_post_loss,
            keys.KL_COEF: self.kl_controller.coef,
            keys.RHO_MEAN: returns.rhos.mean().item(),
            keys.AWR_WEIGHT_MAX: weights.max().item(),
        }

    def check_num_learners(self, num_learners: int) -> None:
        """Refuses several learners: its minibatches are not split into shards (see the error)."""
        if num_learners > 1:
            raise ValueError(
                f"vtrace_awr cannot run on {num_learners} learners: it fits its value head on minibatches of the whole "
                "batch's cached encodings and steps its KL multiplier on each minibatch's KL, which equal shards "
                "do not reproduce; use learner.num_learners 1"
            )

    @torch.no_grad()
    def _cache(self, steps: list[Step], policy: TrainablePolicy) -> _Cache:
        """One forward pass without gradients: every step's decision encoding and summed log-probs (row i of
        each tensor is `steps[i]`)."""
        n = len(steps)
        encodings = torch.zeros(n, policy.hidden_size, device=policy.device)  # (N, H)
        logp, behaviour = torch.zeros(n), torch.zeros(n)  # (N,), (N,)
        for batch in self.prepare_batch(steps, policy):
            out = policy.forward(batch, encodings=True)
            policy.track_ratios(out.logprobs, batch)
            encodings[batch.rows.to(encodings.device)] = out.encodings
            logp[batch.rows] = (out.logprobs * batch.completion_mask).sum(-1).cpu()
            behaviour[batch.rows] = (batch.behaviour_logprobs * batch.completion_mask).sum(-1).cpu()
        rewards = torch.tensor([s.reward for s in steps])  # (N,)
        return _Cache(encodings, logp, behaviour, rewards)

    def _fit_values(self, cache: _Cache, policy: TrainablePolicy, epochs: int) -> float:
        """`epochs` epochs of value-only steps on the cached encodings; returns the mean loss."""
        losses = []
        for _ in range(epochs):
            order = self.rng.sample(range(len(cache.rewards)), len(cache.rewards))
            for start in range(0, len(order), self.vf_minibatch_size):
                rows = torch.tensor(order[start : start + self.vf_minibatch_size])  # (m,)
                values = self.value_head(cache.encodings[rows]).cpu()  # (m,)
                targets = cache.vtrace(rows, values.detach(), self.vtrace_rho_max).vs[:, 0]  # (m,)
                loss = F.mse_loss(values, targets)
                loss.backward()
                policy.optimizer_step()  # only the head has gradients here
                losses.append(loss.item())
        return sum(losses) / max(len(losses), 1)

    @torch.no_grad()
    def _weights(self, cache: _Cache) -> tuple[VTraceReturns, torch.Tensor]:
        """V-trace outputs for the whole batch and the AWR weights of its (normalised) advantages, `(N,)`."""
        rows = torch.arange(len(cache.rewards))  # (N,)
        returns = cache.vtrace(rows, self.value_head(cache.encodings).cpu(), self.vtrace_rho_max)
        stats = self.advantage_stats if self.normalize_advantages else None
        advantages = returns.advantages[:, 0]  # (N,)
        weights = normalized_awr_weights(advantages, self.awr_temperature, self.awr_exponent_clip, stats)  # (N,)
        return returns, weights

    def _policy_epochs(
        self, steps: list[Step], cache: _Cache, targets: torch.Tensor, weights: torch.Tensor, policy: TrainablePolicy
    ) -> dict[str, float]:
        """`policy_epochs` over shuffled minibatches; the KL multiplier is stepped after each minibatch."""
        size = self.minibatch_size or len(steps)
        logs: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.policy_epochs):
            order = self.rng.sample(range(len(steps)), len(steps))
            for start in range(0, len(order), size):
                minibatch = order[start : start + size]  # indices into `steps`
                kl = 0.0
                for batch in self.prepare_batch([steps[i] for i in minibatch], policy):
                    rows = torch.tensor(minibatch)[batch.rows]  # (b,) indices into `steps` and the cache
                    out = policy.forward(batch, encodings=True)
                    values = self.value_head(out.encodings)  # (b,)
                    device = values.device
                    awr_loss, kl_batch, value_mse = self.loss(
                        out.logprobs, values, batch, weights[rows].to(device), targets[rows].to(device)
                    )
                    kl_loss = self.kl_controller.coef * kl_batch
                    value_loss = self.vf_loss_coef * value_mse
                    loss = awr_loss + kl_loss + value_loss
                    share = len(batch.steps) / len(minibatch)
                    (loss * share).backward()
                    kl += kl_batch.item() * share
                    logs[keys.LOSS].append(loss.item())
                    logs[keys.AWR_LOSS].append(awr_loss.item())
                    logs[keys.VALUE_MSE].append(value_mse.item())
                logs[keys.GRAD_NORM].append(policy.optimizer_step())
                logs[keys.APPROX_KL].append(kl)
                self.kl_controller.update(kl, self.kl_target)
        return {k: sum(v) / len(v) for k, v in logs.items()}

    def loss(
        self, logp: torch.Tensor, values: torch.Tensor, batch: TokenBatch, weights: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The micro-batch's awr_loss, KL(behaviour || current) and the value MSE (before their coefficients)."""
        seq_logp = normalized_sum(logp, batch.completion_mask, self.max_generation_len)  # (b,)
        awr_loss = weighted_nll_loss(seq_logp, weights)
        kl = approx_kl(logp, batch.behaviour_logprobs, batch.completion_mask)
        value_mse = F.mse_loss(values, targets)
        return awr_loss, kl, value_mse

    def state_dict(self) -> dict[str, Any]:
        """Value head, KL multiplier (with its optimizer), advantage statistics and the shuffling RNG."""
        return {
            "value_head": self.value_head.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "advantage_stats": self.advantage_stats.state_dict(),
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore everything `state_dict` saved."""
        self.value_head.load_state_dict(state["value_head"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.advantage_stats.load_state_dict(state["advantage_stats"])
        restore_rng(self.rng, state["rng"])


RENAMED = {
    "temperature": "awr_temperature",
    "weight_clip": "awr_exponent_clip",
    "rho_bar": "vtrace_rho_max",
    "vf_coef": "vf_loss_coef",
    "vf_epochs": "vf_pre_epochs and vf_post_epochs",
}


def refuse_old_names(kwargs: dict[str, Any]) -> None:
    """Raise TypeError for the first keyword `VTraceAWR` does not take, naming the new name of a renamed one."""
    for name in kwargs:
        if name in RENAMED:
            raise TypeError(
                f"VTraceAWR argument {name!r} is now {RENAMED[name]} (the name unstable.rl's TrainerConfig uses)"
            )
        raise TypeError(f"VTraceAWR.__init__() got an unexpected keyword argument {name!r}")


def one_step_vtrace(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, rho_bar: float
) -> VTraceReturns:
    """`unstable.rl.vtrace` on `(m,)` decisions as one-step episodes (done, nothing to bootstrap), `(m, 1)` outputs.

    `logp` and `behaviour_logp` are each decision's log-probs summed over its completion tokens.
    """
    m = rewards.shape[0]
    return vtrace(
        logp[:, None],  # (m, 1)
        behaviour_logp[:, None],  # (m, 1)
        rewards[:, None],  # (m, 1)
        values[:, None],  # (m, 1)
        bootstrap_value=torch.zeros(m),
        dones=torch.ones(m, 1),
        mask=torch.ones(m, 1, dtype=torch.bool),
        rho_bar=rho_bar,
        c_bar=rho_bar,
    )


@dataclass
class _Cache:
    """What the no-grad pass keeps per step (row i of each tensor is the batch's step i)."""

    encodings: torch.Tensor  # (N, H) on the learner's device
    logp: torch.Tensor  # (N,) summed current log-probs of the kept completion tokens
    behaviour_logp: torch.Tensor  # (N,) summed behaviour log-probs of the same tokens
    rewards: torch.Tensor  # (N,)

    def vtrace(self, rows: torch.Tensor, values: torch.Tensor, rho_bar: float) -> VTraceReturns:
        """`one_step_vtrace` of the decisions at `rows` with the given current `values`."""
        return one_step_vtrace(self.logp[rows], self.behaviour_logp[rows], self.rewards[rows], values, rho_bar)
