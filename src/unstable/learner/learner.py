"""The Learner: the optimizer, the algorithm and the update counter around a `PolicyModel`.

It implements `TrainablePolicy` for its algorithm (shards, micro-batches, forward, ratio tracking, extra
parameters, optimizer steps) and nothing else: it never polls a buffer, registers checkpoints or logs. The loop
that does (`unstable.runtime.loop.LearnerLoop`) holds a Learner. `state_dict`/`load_state_dict` cover everything
the Learner owns, for resume.

With several data-parallel learners (`learner.num_learners`) each rank holds a Learner whose `parallel` joins it to
the others: every rank runs `train_step` on the whole batch, its algorithm trains on the rank's shard, and the
gradients, the ratio statistics and the metrics are averaged over the ranks (`learner.parallel`). With
`cfg.sharding` 'fsdp' the model is sharded over them: every rank then also saves checkpoints and states together
(the whole weights are gathered onto rank 0, which alone writes), and runs as many micro-batches per pass as the
others, since each forward pass gathers every layer's weights from all of them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from unstable.algorithms.base import BaseAlgo
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import PolicyOutput
from unstable.learner.config import LearnerConfig
from unstable.learner.parallel import DataParallel, full_tensor
from unstable.learner.policy_model import PolicyModel
from unstable.learner.schedule import lr_factor
from unstable.records import Step
from unstable.tracking import keys

log = logging.getLogger(__name__)


def learner_parts(
    model_path: str, cfg: LearnerConfig, *, dtype: str = "float32", rank: int = 0
) -> tuple[PolicyModel, DataParallel]:
    """What a Learner is made of besides its algorithm: the policy model of `model_path` (weights in `dtype`) shaped by
    `cfg.policy`, on `cfg.device` with `cfg.num_threads` torch threads, and rank `rank`'s place among the
    `cfg.num_learners` data-parallel learners."""
    policy = PolicyModel(model_path, cfg.policy, dtype=dtype, device=cfg.device, num_threads=cfg.num_threads)
    return policy, DataParallel(rank, cfg.num_learners, cfg.device, cfg.sharding)


class Learner:
    """Updates `policy` with `algorithm` under `cfg` (learning rate, gradient clip, staleness bound), as rank
    `parallel.rank` of `parallel.world_size` data-parallel learners (one by default)."""

    def __init__(
        self, policy: PolicyModel, algorithm: BaseAlgo, cfg: LearnerConfig, parallel: DataParallel | None = None
    ):
        self.policy = policy
        self.parallel = parallel or DataParallel()
        self.algorithm = algorithm
        self.cfg = cfg
        self.step = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self._ratios = _RatioStats()
        self.skipped = {"update": 0, "in_a_row": 0, "total": 0}

    @classmethod
    def build(
        cls, model_path: str, algorithm: BaseAlgo, cfg: LearnerConfig, *, dtype: str = "float32", rank: int = 0
    ) -> Learner:
        """A Learner of `model_path` (weights in `dtype`) as rank `rank` of `cfg.num_learners` (`learner_parts`; it
        joins the others with `parallel.join`)."""
        policy, parallel = learner_parts(model_path, cfg, dtype=dtype, rank=rank)
        return cls(policy, algorithm, cfg, parallel)

    def initialize(self) -> None:
        """Load the model, build the optimizer, let the algorithm add its parameters, take rank 0's trainable
        weights (every rank calls it together). Idempotent."""
        if self.optimizer is not None:
            return
        self.policy.load(on_device=not self.parallel.sharded)
        self.parallel.shard_model(self.policy.scoring, self.policy.model)
        rate = self.cfg.optimizer.learning_rate  # "base_lr": the rate the schedule scales (_schedule_learning_rate)
        groups = [{"params": self.policy.trainable_parameters(), "base_lr": rate}]
        fused = self.device.startswith("cuda") and not self.parallel.sharded  # one kernel for every weight's update
        self.optimizer = torch.optim.AdamW(groups, lr=rate, fused=fused or None)
        self.algorithm.initialize(self)
        self.parallel.broadcast_parameters(self._parameters())

    # ---- TrainablePolicy: what the algorithm sees -----------------------------------------------------------
    @property
    def device(self) -> str:
        """The policy model's device."""
        return self.policy.device

    @property
    def hidden_size(self) -> int:
        """Width of the policy model's decision-state encodings."""
        return self.policy.hidden_size

    def shard(self, steps: list[Step]) -> list[Step]:
        """This learner's equal part of `steps` (all of them for one learner); see `DataParallel.shard`."""
        return self.parallel.shard(steps)

    def micro_batches(self, steps: list[Step]) -> list[TokenBatch]:
        """Token-budget micro-batches of `steps` on the device; with a sharded model as many on every rank (the
        most any rank packs), since each forward pass is a collective."""
        batches = self.policy.micro_batches(steps)
        if not self.parallel.sharded:
            return batches
        (most,) = self.parallel.all_reduce([len(batches)], "max")
        return batches if len(batches) == most else self.policy.micro_batches(steps, min_count=int(most))

    def forward(self, batch: TokenBatch, *, encodings: bool = False, entropy: bool = False) -> PolicyOutput:
        """The policy model's forward pass (see `PolicyModel.forward`)."""
        return self.policy.forward(batch, encodings=encodings, entropy=entropy)

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Token log-probs of `batch` under the warm start (see `PolicyModel.reference_logprobs`)."""
        return self.policy.reference_logprobs(batch)

    def move_reference(self, fraction: float = 1.0) -> None:
        """Move the KL reference `fraction` of the way to the current policy (see `PolicyModel.move_reference`)."""
        self.policy.move_reference(fraction)

    @torch.no_grad()
    def track_ratios(self, logprobs: torch.Tensor, batch: TokenBatch) -> None:
        """Record `exp(current - behaviour)` of `batch`'s completion tokens for this update's ratio metrics.

        They become `learner/ratio_mean` and `learner/ratio_max`: how far the learner's policy has moved from the
        samplers'. Every RL algorithm calls this on its first pass over the batch.
        """
        ratios = torch.exp(logprobs - batch.behaviour_logprobs)[batch.completion_mask.bool()]  # (n_tokens,)
        self._ratios.add(ratios)

    def add_parameters(self, params: Iterable[torch.nn.Parameter], lr: float | None = None) -> None:
        """Train extra parameters (a value head) with the same optimizer, at `lr` if given."""
        group = {"params": list(params), "base_lr": self.cfg.optimizer.learning_rate if lr is None else lr}
        self.optimizer.add_param_group(group | {"lr": group["base_lr"]})

    def optimizer_step(self) -> float:
        """Average the gradients over the learners, clip, step and zero them; returns the pre-clip gradient norm.

        A non-finite gradient (a NaN or inf loss) is dropped without stepping, counted and logged; more than
        `cfg.optimizer.max_skipped_updates` such steps in a row stop the run, since the weights will not recover.
        """
        params = self._parameters()
        self.parallel.average_gradients(params)
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.cfg.optimizer.grad_clip))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self.skipped["in_a_row"] = 0
        else:
            self._skip(float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def _parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter the optimizer trains (the policy's and the algorithm's), in a fixed order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _skip(self, grad_norm: float) -> None:
        for counter in self.skipped:
            self.skipped[counter] += 1
        log.warning("update %d: gradient norm %s, optimizer step skipped", self.step + 1, grad_norm)
        if self.skipped["in_a_row"] > self.cfg.optimizer.max_skipped_updates:
            raise RuntimeError(
                f"{self.skipped['in_a_row']} optimizer steps in a row had a non-finite gradient "
                f"(learner.optimizer.max_skipped_updates = {self.cfg.optimizer.max_skipped_updates})"
            )

    # ---- updates -------------------------------------------------------------------------------------------
    def staleness(self, step: Step) -> int:
        """Learner updates since the policy that sampled `step` (the base model, version -1, counts as 0)."""
        return self.step - max(step.policy_version, 0)

    def drop_stale(self, steps: list[Step]) -> tuple[list[Step], int]:
        """`steps` without those more than `cfg.max_staleness` updates old, and how many were dropped. With
        several learners the fresh steps are also cut to a multiple of their number (equal shards); the few cut
        off count as dropped."""
        if self.cfg.max_staleness is None:
            return steps, 0
        fresh = [s for s in steps if self.staleness(s) <= self.cfg.max_staleness]
        fresh = fresh[: len(fresh) - len(fresh) % self.parallel.world_size]
        return fresh, len(steps) - len(fresh)

    def train_step(self, steps: list[Step]) -> dict[str, float]:
        """One algorithm update on `steps`; returns its metrics plus batch statistics.

        With several learners every rank calls it with the whole batch at once; the metrics are the ranks' mean
        (the ratios' over all their tokens) and the batch statistics the whole batch's."""
        self.initialize()
        start = time.perf_counter()
        steps, truncated = self._with_completions(steps)
        staleness = [self.staleness(s) for s in steps]
        self._ratios = _RatioStats()
        self.skipped["update"] = 0
        rate = self._schedule_learning_rate()
        metrics = self.parallel.average_metrics(self.algorithm.update(steps, self))
        metrics |= self._ratios.over(self.parallel).metrics()
        self.step += 1
        seconds = time.perf_counter() - start
        tokens = sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in steps)
        return metrics | {
            keys.STEP: self.step,
            keys.BATCH_SIZE: len(steps),
            keys.MEAN_REWARD: sum(s.reward for s in steps) / len(steps),
            keys.MEAN_COMPLETION_TOKENS: sum(len(s.completion_token_ids) for s in steps) / len(steps),
            keys.STALENESS_MEAN: sum(staleness) / len(staleness),
            keys.STALENESS_MAX: max(staleness),
            keys.TRUNCATED_DROPPED: truncated,
            keys.SKIPPED_UPDATES: self.skipped["update"],
            keys.SKIPPED_UPDATES_TOTAL: self.skipped["total"],
            keys.LEARNING_RATE: rate,
            keys.UPDATE_SECONDS: seconds,
            keys.TRAIN_TOKENS_PER_S: tokens / max(seconds, 1e-9),
        }

    def _with_completions(self, steps: list[Step]) -> tuple[list[Step], int]:
        """`steps` that keep a completion token within `cfg.policy.max_train_len` (cut to a multiple of the learners'
        number), and how many were left out (with a warning). Raises RuntimeError, naming the setting, when none do."""
        limit = self.cfg.policy.max_train_len
        if limit is None:
            return steps, 0
        kept = [s for s in steps if len(s.prompt_token_ids) < limit]
        kept = kept[: len(kept) - len(kept) % self.parallel.world_size]
        if not kept:
            longest = max(len(s.prompt_token_ids) for s in steps)
            raise RuntimeError(
                f"no step of the batch keeps a completion token within learner.policy.max_train_len = {limit} "
                f"(prompts of up to {longest} tokens): raise it above the prompts' length"
            )
        if len(kept) < len(steps):
            log.warning(
                "update %d: %d of %d steps left out: learner.policy.max_train_len = %d cuts off their completion",
                self.step + 1,
                len(steps) - len(kept),
                len(steps),
                limit,
            )
        return kept, len(steps) - len(kept)

    def _schedule_learning_rate(self) -> float:
        """Set every parameter group's rate for this update from `cfg.optimizer.lr_schedule`; returns the policy's
        rate."""
        opt = self.cfg.optimizer
        factor = lr_factor(self.step, self.cfg.num_steps, opt.lr_schedule, opt.warmup_steps, opt.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
        return self.optimizer.param_groups[0]["lr"]

    def save_checkpoint(self, directory: str) -> str:
        """Write the current weights (adapter or full model) to `directory` atomically; returns its path. With a
        sharded model every rank calls it together: the whole weights are gathered and rank 0 writes them."""
        weights = self.parallel.full_model_state(self.policy.model)
        if self.parallel.rank:
            return directory
        return self.policy.save(directory, weights)

    def served_weights(self) -> tuple[dict | None, dict[str, torch.Tensor]] | None:
        """A CPU copy of the current policy as an engine serves it (`PolicyModel.served_weights`), to hand over in
        memory; None for a sharded model (its weights are gathered only to be saved)."""
        if self.parallel.sharded:
            return None
        return self.policy.served_weights("cpu")

    def write_checkpoint(self, directory: str, served: tuple[dict | None, dict[str, torch.Tensor]]) -> str:
        """Write `served` (from `served_weights`) as the checkpoint folder `directory`; returns its path."""
        return self.policy.write_served(directory, served)

    # ---- state for resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the learner owns: update counter, trainable weights (and the reference's, once moved), optimizer
        and algorithm state, skip counters and this process's RNGs (Python's and torch's). With a sharded model every
        rank calls it together and rank 0's holds the whole weights and the full optimizer state (keyed by name)."""
        self.initialize()
        return {
            "step": self.step,
            "policy": self.policy.trainable_state(),
            "reference": self.policy.reference_state(),
            "optimizer": self.parallel.full_optimizer_state(self.policy.model, self.optimizer),
            "algorithm": self.algorithm.state_dict(),
            "skipped": dict(self.skipped),
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the learner must be built with the same config and algorithm)."""
        self.initialize()
        self.step = state["step"]
        self.policy.load_trainable_state(state["policy"])
        self.policy.load_reference_state(state.get("reference"))  # absent from states saved before it moved
        self.parallel.load_optimizer_state(self.policy.model, self.optimizer, state["optimizer"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.skipped = dict(state["skipped"])
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])


@dataclass
class _RatioStats:
    """Running mean and max of importance ratios over one update."""

    total: float = 0.0
    count: int = 0
    max: float = 0.0

    def add(self, ratios: torch.Tensor) -> None:
        """Count `ratios`, `(n,)`."""
        if ratios.numel():
            self.total += float(ratios.sum())
            self.count += ratios.numel()
            self.max = max(self.max, float(ratios.max()))

    def over(self, parallel: DataParallel) -> _RatioStats:
        """These statistics combined over the learners of `parallel` (every rank's tokens)."""
        total, count = parallel.all_reduce([self.total, self.count])
        (largest,) = parallel.all_reduce([self.max], "max")
        return _RatioStats(total, int(count), largest)

    def metrics(self) -> dict[str, float]:
        """`learner/ratio_mean` and `learner/ratio_max`, or nothing if no ratio was recorded."""
        if not self.count:
            return {}
        return {keys.RATIO_MEAN: self.total / self.count, keys.RATIO_MAX: self.max}
