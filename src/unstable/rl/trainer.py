"""`TorchTrainer`: ubrl's algorithm (V-trace advantages, AWR weighted likelihood, a KL Lagrange multiplier
and a value function trained mostly on frozen state encodings) for any `Agent`, plus checkpoint and resume.

Each `train_step` runs over the replay buffer (the newest episodes, about `replay_buffer_steps` time-steps):
  0. cache: one no-grad pass of the agent gives every state's encoding and the pre-step action log-likelihoods;
  1. value pre-training: `vf_pre_epochs` epochs of the value MLP on the frozen encodings, its V-trace targets
     recomputed from the current MLP each epoch;
  2. advantages: V-trace with the fitted MLP, normalised by running statistics, turned into AWR weights
     exp(A / temperature), self-normalised to mean 1;
  3. agent: `policy_epochs` over minibatches of episodes, one optimizer step each, on
         awr_loss   = mean_t -weight_t * log pi(a_t | s_t)
         kl_loss    = kl_coef * KL(pre-step policy || current policy)
         value_loss = vf_loss_coef * mean_t (V(live encoding_t) - vs_t)^2     (shapes the encodings)
         loss       = awr_loss + kl_loss + value_loss + extra_loss_coef * extra_loss
     with kl_coef a Lagrange multiplier (`KLController`) stepped after each minibatch towards `kl_target`;
  4. value post-training: `vf_post_epochs` more epochs on the (now slightly stale) frozen encodings.
The KL is measured from the policy at the start of the step rather than the behaviour policy, so off-policy
and offline episodes (whose behaviour may be far away or unknown) still get a trust region.

Minibatches hold whole episodes up to `minibatch_size` time-steps. The size starts at `minibatch_max_size`,
halves (and the minibatch is retried) when a pass runs out of memory, and doubles back towards the maximum
after every train step that did not run out of memory.
"""

from __future__ import annotations

import json
import math
import pickle
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from unstable import atomic
from unstable.rl.agent import Agent, AgentOutput
from unstable.rl.awr import normalized_awr_weights, weighted_nll_loss
from unstable.rl.cluster import Cluster
from unstable.rl.config import TrainerConfig
from unstable.rl.kl import KLController, approx_kl
from unstable.rl.normalize import RunningMeanStd, masked_mean
from unstable.rl.vtrace import VTraceReturns, vtrace

# train stats returned by `train_step`
LOSS = "train/loss"
AWR_LOSS = "train/awr_loss"
KL_LOSS = "train/kl_loss"
VALUE_LOSS = "train/value_loss"
EXTRA_LOSS = "train/extra_loss"
KL = "train/kl"
KL_COEF = "train/kl_coef"
GRAD_NORM = "train/grad_norm"
VF_PRE_LOSS = "train/vf_pre_loss"
VF_POST_LOSS = "train/vf_post_loss"
ADVANTAGE_MEAN = "train/advantage_mean"
AWR_WEIGHT_MAX = "train/awr_weight_max"
RHO_MEAN = "train/rho_mean"
MINIBATCH_SIZE = "train/minibatch_size"
OOM_COUNT = "train/oom_count"
TRAIN_STEP = "train/step"
ENV_STEPS = "train/env_steps"
BUFFER_EPISODES = "train/buffer_episodes"
STEP_SECONDS = "train/step_seconds"

CHECKPOINT_DIR = "checkpoints"
BEST_CHECKPOINT = "best.pt"
EVAL_STATS_FILE = "eval_stats.jsonl"


@dataclass
class _Episode:
    """One episode in the replay buffer: the caller's object and what was recorded when it was sampled."""

    episode: Any
    rewards: Tensor  # (T,)
    behaviour_lls: Tensor | None  # (T,) or None when the behaviour policy is unknown (offline data)
    terminated: bool


@dataclass
class _Cache:
    """Step 0's frozen view of the buffer, padded to `(B, T)` (T the longest episode)."""

    encodings: Tensor  # (B, T + 1, E)
    pre_lls: Tensor  # (B, T) action log-likelihoods under the pre-step policy
    behaviour_lls: Tensor  # (B, T)
    rewards: Tensor  # (B, T)
    dones: Tensor  # (B, T) 1 at the last step of a terminated episode
    mask: Tensor  # (B, T)
    lengths: Tensor  # (B,)
    dists: list[torch.distributions.Distribution] | None


class TorchTrainer:
    """Trains an `Agent` from episodes added with `add_episode`; see the module docstring for the algorithm."""

    def __init__(self, cfg: TrainerConfig, agent: Agent) -> None:
        if not isinstance(getattr(agent, "state_encoding_size", None), int):
            raise ValueError("agent.state_encoding_size must be an int (the width of its state encodings)")
        self.cfg = cfg
        self.cluster = Cluster(cfg.use_accelerate, cfg.device)
        self.device = self.cluster.device
        self.agent = agent.to(self.device)
        self.vf = _mlp(agent.state_encoding_size, cfg.vf_hidden_sizes, 1).to(self.device)
        self.agent_optimizer = torch.optim.AdamW(
            agent.parameters(), lr=cfg.agent_lr, weight_decay=cfg.agent_weight_decay
        )
        self.vf_optimizer = torch.optim.Adam(self.vf.parameters(), lr=cfg.vf_lr)
        self.kl_controller = KLController(cfg.kl_coef_init, cfg.kl_coef_min, cfg.kl_coef_max, cfg.kl_coef_lr)
        self.advantage_stats = RunningMeanStd(momentum=cfg.advantage_stats_momentum)
        self.rng = random.Random(cfg.seed + self.cluster.process_index)
        self.buffer: list[_Episode] = []
        self.buffer_steps = 0
        self.minibatch_size = cfg.minibatch_max_size
        self.oom_count = 0
        self.train_steps = 0
        self.total_env_steps = 0
        self.total_episodes = 0
        self.best_primary_stat: float | None = None
        self.last_eval_stats: dict[str, float] = {}
        self._best_is_new = False
        self._last_checkpoint_step = -1

    # ---- data --------------------------------------------------------------------------------------------

    def add_episode(
        self, episode: Any, rewards: Tensor, action_lls: Tensor | None = None, terminated: bool = True
    ) -> None:
        """Add an episode of T actions: its `(T,)` rewards, the `(T,)` log-likelihoods its actions had under the
        policy that chose them (None for offline data from an unknown policy: treated as on-policy), and whether
        it ended in a terminal state (False if it was cut short: its last state's value is bootstrapped)."""
        rewards = torch.as_tensor(rewards, dtype=torch.float32).detach().cpu()
        if rewards.dim() != 1 or rewards.numel() == 0:
            raise ValueError(f"rewards must be a non-empty (T,) tensor, got shape {tuple(rewards.shape)}")
        if action_lls is not None:
            action_lls = torch.as_tensor(action_lls, dtype=torch.float32).detach().cpu()
            if action_lls.shape != rewards.shape:
                raise ValueError(f"action_lls shape {tuple(action_lls.shape)} != rewards shape {tuple(rewards.shape)}")
        self.buffer.append(_Episode(episode, rewards, action_lls, bool(terminated)))
        self.buffer_steps += rewards.numel()
        while self.buffer_steps > self.cfg.replay_buffer_steps and len(self.buffer) > 1:
            self.buffer_steps -= self.buffer.pop(0).rewards.numel()
        self.total_env_steps += rewards.numel()
        self.total_episodes += 1

    # ---- the algorithm -----------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        """Steps 0-4 of the algorithm over the replay buffer; returns the train stats."""
        if not self.buffer:
            raise RuntimeError("add_episode must be called before train_step")
        start = time.perf_counter()
        ooms_before = self.oom_count
        cache = self._cache()
        vf_pre_loss = self._fit_value(cache, self.cfg.vf_pre_epochs)
        returns, weights = self._advantages(cache)
        stats = self._train_agent(cache, returns.vs, weights)
        vf_post_loss = self._fit_value(cache, self.cfg.vf_post_epochs)
        if self.oom_count == ooms_before:
            self.minibatch_size = min(2 * self.minibatch_size, self.cfg.minibatch_max_size)
        self.train_steps += 1
        return stats | {
            VF_PRE_LOSS: vf_pre_loss,
            VF_POST_LOSS: vf_post_loss,
            KL_COEF: self.kl_controller.coef,
            ADVANTAGE_MEAN: masked_mean(returns.advantages, cache.mask).item(),
            AWR_WEIGHT_MAX: weights.max().item(),
            RHO_MEAN: masked_mean(returns.rhos, cache.mask).item(),
            MINIBATCH_SIZE: float(self.minibatch_size),
            OOM_COUNT: float(self.oom_count),
            TRAIN_STEP: float(self.train_steps),
            ENV_STEPS: float(self.total_env_steps),
            BUFFER_EPISODES: float(len(self.buffer)),
            STEP_SECONDS: time.perf_counter() - start,
        }

    @torch.no_grad()
    def _cache(self) -> _Cache:
        """Step 0: every episode's frozen state encodings and pre-step log-likelihoods."""
        n = len(self.buffer)
        outputs: list[AgentOutput | None] = [None] * n

        def forward(rows: list[int]) -> None:
            for row, out in zip(rows, self._forward(rows)):
                outputs[row] = out

        self._over_minibatches(list(range(n)), forward, synced=False)
        pre_lls = [out.action_lls.float() for out in outputs]
        behaviour = [_known_or(ep.behaviour_lls, ll) for ep, ll in zip(self.buffer, pre_lls)]
        lengths = torch.tensor([ep.rewards.numel() for ep in self.buffer])  # (B,)
        mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T)
        dones = torch.zeros(mask.shape)  # (B, T)
        dones[torch.arange(n), lengths - 1] = torch.tensor([float(ep.terminated) for ep in self.buffer])
        dists = [out.action_dists for out in outputs]
        return _Cache(
            encodings=_pad([out.state_encodings.float() for out in outputs]),  # (B, T + 1, E)
            pre_lls=_pad(pre_lls),  # (B, T)
            behaviour_lls=_pad(behaviour).to(self.device),  # (B, T)
            rewards=_pad([ep.rewards for ep in self.buffer]).to(self.device),  # (B, T)
            dones=dones.to(self.device),
            mask=mask.to(self.device),
            lengths=lengths.to(self.device),
            dists=dists if self.cfg.use_exact_kl and all(d is not None for d in dists) else None,
        )

    def _vtrace(self, cache: _Cache, values: Tensor) -> VTraceReturns:
        """V-trace of the pre-step policy over the buffer, given the values `(B, T + 1)` of every state."""
        bootstrap = values.gather(1, cache.lengths[:, None])[:, 0]  # (B,) value after each episode's last step
        return vtrace(
            logp_target=cache.pre_lls,
            logp_behaviour=cache.behaviour_lls,
            rewards=cache.rewards,
            values=values[:, :-1],  # (B, T)
            bootstrap_value=bootstrap,
            dones=cache.dones,
            mask=cache.mask,
            gamma=self.cfg.discount,
            lam=self.cfg.vtrace_lambda,
            rho_bar=self.cfg.vtrace_rho_max,
            c_bar=self.cfg.vtrace_c_max,
        )

    def _values(self, encodings: Tensor) -> Tensor:
        """The value MLP on `(..., E)` encodings, `(...)`."""
        return self.vf(encodings)[..., 0]

    def _fit_value(self, cache: _Cache, epochs: int) -> float:
        """Steps 1 and 4: value-only epochs on frozen encodings, targets recomputed each epoch; the mean loss."""
        steps = cache.mask.nonzero()  # (N, 2) (episode, time) of every valid step
        n_minibatches = self.cluster.max_int(math.ceil(len(steps) / self.cfg.vf_minibatch_size))
        losses = []
        for _ in range(epochs):
            with torch.no_grad():
                targets = self._vtrace(cache, self._values(cache.encodings)).vs  # (B, T)
            order = steps[torch.randperm(len(steps), generator=self._torch_rng())]  # (N, 2)
            for i in range(n_minibatches):
                start = (i * self.cfg.vf_minibatch_size) % len(order)
                ep, t = order[start : start + self.cfg.vf_minibatch_size].T  # (m,), (m,)
                loss = F.mse_loss(self._values(cache.encodings[ep, t]), targets[ep, t])
                self.vf_optimizer.zero_grad()
                loss.backward()
                self._optimizer_step(self.vf_optimizer, self.vf)
                losses.append(loss.item())
        return sum(losses) / max(len(losses), 1)

    @torch.no_grad()
    def _advantages(self, cache: _Cache) -> tuple[VTraceReturns, Tensor]:
        """Step 2: V-trace outputs with the fitted value MLP and the AWR weights of their advantages `(B, T)`."""
        returns = self._vtrace(cache, self._values(cache.encodings))
        stats = self.advantage_stats if self.cfg.normalize_advantages else None
        weights = normalized_awr_weights(
            returns.advantages, self.cfg.awr_temperature, self.cfg.awr_exponent_clip, stats, cache.mask
        )  # (B, T)
        return returns, weights

    def _train_agent(self, cache: _Cache, targets: Tensor, weights: Tensor) -> dict[str, float]:
        """Step 3: `policy_epochs` over minibatches of episodes; the KL multiplier is stepped after each."""
        logs: dict[str, list[float]] = defaultdict(list)

        def step(rows: list[int]) -> None:
            self.agent_optimizer.zero_grad()
            losses, kl = self._agent_losses(cache, rows, targets, weights)
            loss = sum(losses.values())
            loss.backward()
            self.vf.zero_grad()  # the value MLP only learns in steps 1 and 4; here it shapes the encodings
            logs[GRAD_NORM].append(self._optimizer_step(self.agent_optimizer, self.agent))
            self.kl_controller.update(kl.item(), self.cfg.kl_target)
            logs[LOSS].append(loss.item())
            logs[KL].append(kl.item())
            for name, value in losses.items():
                logs[name].append(value.item())

        for _ in range(self.cfg.policy_epochs):
            self._over_minibatches(self.rng.sample(range(len(self.buffer)), len(self.buffer)), step, synced=True)
        return {name: sum(values) / len(values) for name, values in logs.items()}

    def _agent_losses(
        self, cache: _Cache, rows: list[int], targets: Tensor, weights: Tensor
    ) -> tuple[dict[str, Tensor], Tensor]:
        """The named loss terms of one minibatch of episodes (each times its coefficient) and its mean KL."""
        outputs = self._forward(rows)
        index = torch.tensor(rows, device=self.device)
        mask = cache.mask[index]  # (b, T)
        horizon = mask.shape[1]
        lls = _pad([out.action_lls for out in outputs], horizon)  # (b, T)
        encodings = _pad([out.state_encodings for out in outputs], horizon + 1)  # (b, T + 1, E)
        if cache.dists is None:
            kl = approx_kl(lls, cache.pre_lls[index], mask)
        else:
            step_kls = [_step_kl(cache.dists[row], out.action_dists) for row, out in zip(rows, outputs)]
            kl = masked_mean(_pad(step_kls, horizon), mask)
        value_error = (self._values(encodings[:, :-1]) - targets[index]) ** 2  # (b, T)
        extra = [out.extra_loss for out in outputs if out.extra_loss is not None]
        losses = {
            AWR_LOSS: weighted_nll_loss(lls, weights[index], mask),
            KL_LOSS: self.kl_controller.coef * kl,
            VALUE_LOSS: self.cfg.vf_loss_coef * masked_mean(value_error, mask),
        }
        if extra:
            losses[EXTRA_LOSS] = self.cfg.extra_loss_coef * torch.stack(extra).mean()
        return losses, kl.detach()

    # ---- plumbing ----------------------------------------------------------------------------------------

    def _forward(self, rows: list[int]) -> list[AgentOutput]:
        """The agent on the buffered episodes at `rows`, its outputs checked against the contract."""
        outputs = self.agent([self.buffer[r].episode for r in rows])
        if len(outputs) != len(rows):
            raise ValueError(f"agent returned {len(outputs)} outputs for {len(rows)} episodes")
        for row, out in zip(rows, outputs):
            out.check(self.agent.state_encoding_size)
            if out.action_lls.shape != self.buffer[row].rewards.shape:
                raise ValueError(
                    f"agent gave {out.action_lls.shape[0]} action_lls for an episode with "
                    f"{self.buffer[row].rewards.numel()} rewards"
                )
        return outputs

    def _over_minibatches(self, rows: list[int], fn: Callable[[list[int]], None], synced: bool) -> None:
        """Call `fn` on consecutive packs of whole episodes of at most `minibatch_size` time-steps.

        A pack that runs out of memory halves `minibatch_size` and is re-packed (a single episode that does not
        fit re-raises). When `synced` across several processes, every process makes as many calls as the
        busiest one (cycling through its packs), so the collective gradient averaging stays in step; there an
        out-of-memory error is raised, since the other processes could not follow a re-packing.
        """
        if synced and self.cluster.num_processes > 1:
            packs = []
            while len(rows) > sum(map(len, packs)):
                packs.append(self._take_pack(rows[sum(map(len, packs)) :]))
            for i in range(self.cluster.max_int(len(packs))):
                fn(packs[i % len(packs)])
            return
        pending = list(rows)
        while pending:
            pack = self._take_pack(pending)
            try:
                fn(pack)
            except torch.OutOfMemoryError:
                if len(pack) == 1:
                    raise
                self.agent_optimizer.zero_grad()
                self.minibatch_size = max(1, self.minibatch_size // 2)
                self.oom_count += 1
                continue
            pending = pending[len(pack) :]

    def _take_pack(self, rows: list[int]) -> list[int]:
        """The longest prefix of `rows` within `minibatch_size` time-steps (at least one episode)."""
        total = 0
        for i, row in enumerate(rows):
            total += self.buffer[row].rewards.numel() + 1
            if total > self.minibatch_size and i > 0:
                return rows[:i]
        return rows

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> float:
        """Average gradients over processes, clip them and step; returns the pre-clip gradient norm."""
        self.cluster.mean_grads(module.parameters())
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.grad_norm_max)
        optimizer.step()
        return norm.item()

    def _torch_rng(self) -> torch.Generator:
        """A torch generator seeded from the trainer's Python RNG (so shuffles resume with its state)."""
        return torch.Generator().manual_seed(self.rng.getrandbits(63))

    # ---- evaluation and checkpoints ----------------------------------------------------------------------

    def add_eval_stats(self, stats: dict[str, float]) -> None:
        """Record evaluation stats; a new best `cfg.primary_stat` makes the next `maybe_checkpoint` save best.pt."""
        self.last_eval_stats = {name: float(value) for name, value in stats.items()}
        if self.cluster.is_main_process:
            self.cfg.run_dir.mkdir(parents=True, exist_ok=True)
            row = {TRAIN_STEP: self.train_steps, ENV_STEPS: self.total_env_steps} | self.last_eval_stats
            with open(self.cfg.run_dir / EVAL_STATS_FILE, "a") as f:
                f.write(json.dumps(row) + "\n")
        if self.cfg.primary_stat not in stats:
            return
        value = float(stats[self.cfg.primary_stat])
        if self.best_primary_stat is None or self._better(value, self.best_primary_stat):
            self.best_primary_stat = value
            self._best_is_new = True

    def _better(self, value: float, than: float) -> bool:
        return value > than if self.cfg.primary_stat_higher_is_better else value < than

    def maybe_checkpoint(self) -> list[Path]:
        """Save `checkpoints/step_<n>.pt` every `checkpoint_interval` train steps and `best.pt` after a new best
        primary stat (when `checkpoint_best`); returns the files written (only the main process writes)."""
        written = []
        interval = self.cfg.checkpoint_interval
        if interval and self.train_steps % interval == 0 and self._last_checkpoint_step != self.train_steps:
            written.append(self.cfg.run_dir / CHECKPOINT_DIR / f"step_{self.train_steps:08d}.pt")
            self._last_checkpoint_step = self.train_steps
        if self.cfg.checkpoint_best and self._best_is_new:
            written.append(self.cfg.run_dir / BEST_CHECKPOINT)
            self._best_is_new = False
        if written and self.cluster.is_main_process:
            state = self.state_dict()
            for path in written:
                _atomic_save(state, path)
        self.cluster.wait_for_everyone()
        return written

    def attempt_resume(self) -> bool:
        """Load the newest `checkpoints/step_<n>.pt` of the run directory, if any; returns whether it did.

        Only tensors and plain values are unpickled (`weights_only`): a checkpoint holding any other object is
        refused with a ValueError naming it, before that object's code can run."""
        checkpoints = sorted((self.cfg.run_dir / CHECKPOINT_DIR).glob("step_*.pt"))
        if not checkpoints:
            return False
        try:
            state = torch.load(checkpoints[-1], map_location=self.device, weights_only=True)
        except pickle.UnpicklingError as error:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
            what = f"it names {found.group(1)}" if found else "refused"
            raise ValueError(
                f"checkpoint {checkpoints[-1]} holds objects other than tensors and plain values ({what})"
            ) from None
        self.load_state_dict(state)
        return True

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training: weights, optimizers, multiplier, statistics, counters, RNG."""
        return {
            "agent": self.agent.state_dict(),
            "vf": self.vf.state_dict(),
            "agent_optimizer": self.agent_optimizer.state_dict(),
            "vf_optimizer": self.vf_optimizer.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "advantage_stats": self.advantage_stats.state_dict(),
            "rng": self.rng.getstate(),
            "minibatch_size": self.minibatch_size,
            "oom_count": self.oom_count,
            "train_steps": self.train_steps,
            "total_env_steps": self.total_env_steps,
            "total_episodes": self.total_episodes,
            "best_primary_stat": self.best_primary_stat,
            "last_eval_stats": dict(self.last_eval_stats),
            "config": self.cfg.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (the config is kept as given to the constructor)."""
        self.agent.load_state_dict(state["agent"])
        self.vf.load_state_dict(state["vf"])
        self.agent_optimizer.load_state_dict(state["agent_optimizer"])
        self.vf_optimizer.load_state_dict(state["vf_optimizer"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.advantage_stats.load_state_dict(state["advantage_stats"])
        self.rng.setstate(_as_rng_state(state["rng"]))
        self.minibatch_size = state["minibatch_size"]
        self.oom_count = state["oom_count"]
        self.train_steps = state["train_steps"]
        self.total_env_steps = state["total_env_steps"]
        self.total_episodes = state["total_episodes"]
        self.best_primary_stat = state["best_primary_stat"]
        self.last_eval_stats = dict(state["last_eval_stats"])
        self._last_checkpoint_step = self.train_steps


def _mlp(in_size: int, hidden_sizes: list[int], out_size: int) -> torch.nn.Sequential:
    """Linear layers of `hidden_sizes` widths with ReLU between them."""
    sizes = [in_size, *hidden_sizes, out_size]
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _pad(rows: list[Tensor], length: int | None = None) -> Tensor:
    """Stack `(T_i, ...)` tensors into `(B, length, ...)`, right-padded with zeros (length defaults to max T_i)."""
    padded = pad_sequence(rows, batch_first=True)  # (B, max T_i, ...)
    if length is not None and padded.shape[1] < length:
        extra = torch.zeros(padded.shape[0], length - padded.shape[1], *padded.shape[2:], dtype=padded.dtype)
        padded = torch.cat([padded, extra.to(padded.device)], dim=1)  # (B, length, ...)
    return padded


def _known_or(behaviour_lls: Tensor | None, pre_lls: Tensor) -> Tensor:
    """The recorded behaviour log-likelihoods, or the pre-step policy's when unknown (importance weight 1)."""
    return behaviour_lls if behaviour_lls is not None else pre_lls.cpu()


def _step_kl(old: torch.distributions.Distribution, new: torch.distributions.Distribution) -> Tensor:
    """Exact KL(old || new) per time-step `(T,)`, summed over any event or trailing batch dimensions."""
    kl = torch.distributions.kl_divergence(old, new)
    return kl.reshape(kl.shape[0], -1).sum(-1)  # (T,)


def _atomic_save(state: dict[str, Any], path: Path) -> None:
    """`torch.save` to a temporary file then rename, so a crash never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.replace_file(path, "wb") as f:
        torch.save(state, f)


def _as_rng_state(state: Any) -> tuple:
    """A `random.Random` state that went through a checkpoint (lists back to tuples)."""
    version, internal, gauss = state
    return version, tuple(internal), gauss
