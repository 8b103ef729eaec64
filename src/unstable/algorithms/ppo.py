"""PPO: a clipped importance-ratio policy gradient against the log-probs of the policy that sampled the data.

Per completion token t of step i, with r_it = exp(logp_it - logp_behaviour_it) and A_i the step's reward
(already baselined by the reward transforms; whitened over the batch with `whiten_advantages`):

    pg_loss      = (1/N) sum_i sum_t max(-r_it A_i, -clip(r_it, 1-eps, 1+eps) A_i) / D
    kl_loss      = kl_coef * KL(behaviour || current)            (k3 estimate, mean over tokens)
    entropy_loss = -entropy_coef * mean token entropy
    loss         = pg_loss + kl_loss + entropy_loss

The ratio is taken against the recorded `behaviour_logprobs`, the asynchronous sampler's policy, so the clip
bounds how far an update moves from the policy that produced the data however stale it is. `epochs` passes
over shuffled minibatches of `minibatch_size` steps (None: the whole batch), one optimizer step each.
D as in `Reinforce`. Data-parallel learners whiten and shuffle the whole batch alike (one seed) and each trains on
its equal shard of every minibatch, so each takes the same optimizer steps and their average is one learner's
(the KL and entropy terms are token means per micro-batch, as in `Reinforce`'s KL).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from typing import Any

import torch

from unstable.algorithms.base import BaseAlgo, normalized_sum, restore_rng
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.rl import approx_kl, masked_mean, masked_whiten
from unstable.tracking import keys


class PPO(BaseAlgo):
    """Clipped-surrogate policy optimisation over several epochs of minibatches."""

    def __init__(
        self,
        clip_eps: float = 0.2,
        epochs: int = 2,
        minibatch_size: int | None = None,
        kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        whiten_advantages: bool = False,
        max_generation_len: int | None = None,
        seed: int = 0,
    ):
        self.clip_eps = clip_eps
        self.epochs = epochs
        self.minibatch_size = minibatch_size
        self.kl_coef = kl_coef
        self.entropy_coef = entropy_coef
        self.whiten_advantages = whiten_advantages
        self.max_generation_len = max_generation_len
        self.rng = random.Random(seed)

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """`epochs` passes over shuffled minibatches, one optimizer step per minibatch."""
        if self.whiten_advantages:
            whitened = masked_whiten(torch.tensor([s.reward for s in steps]))  # (N,)
            steps = [replace(s, reward=float(a)) for s, a in zip(steps, whitened)]
        size = self.minibatch_size or len(steps)
        logs: dict[str, list[float]] = defaultdict(list)
        for epoch in range(self.epochs):
            order = self.rng.sample(steps, len(steps))
            for start in range(0, len(order), size):
                minibatch = policy.shard(order[start : start + size])
                self._minibatch_step(minibatch, policy, logs, first_epoch=epoch == 0)
        return {k: sum(v) / len(v) for k, v in logs.items()}

    def check_num_learners(self, num_learners: int) -> None:
        """Every minibatch must split into equal shards: `minibatch_size` a multiple of `num_learners`."""
        if self.minibatch_size is not None and self.minibatch_size % num_learners:
            raise ValueError(
                f"ppo's minibatch_size {self.minibatch_size} does not split into {num_learners} equal shards "
                f"(learner.num_learners {num_learners}): make it a multiple"
            )

    def _minibatch_step(
        self, steps: list[Step], policy: TrainablePolicy, logs: dict[str, list[float]], first_epoch: bool
    ) -> None:
        """Accumulate the loss over the minibatch's micro-batches, then take one optimizer step."""
        for batch in self.prepare_batch(steps, policy):
            out = policy.forward(batch, entropy=bool(self.entropy_coef))
            logp = out.logprobs  # (b, L-1)
            if first_epoch:
                policy.track_ratios(logp, batch)
            share = len(batch.steps) / len(steps)
            pg_loss, clip_fraction = self.policy_loss(logp, batch)
            kl = approx_kl(logp, batch.behaviour_logprobs, batch.completion_mask)
            kl_loss = self.kl_coef * kl
            entropy = masked_mean(out.entropy, batch.completion_mask) if self.entropy_coef else torch.zeros(())
            entropy_loss = -self.entropy_coef * entropy
            loss = pg_loss + kl_loss + entropy_loss
            (loss * share).backward()
            logs[keys.LOSS].append(loss.item())
            logs[keys.PG_LOSS].append(pg_loss.item())
            logs[keys.KL_LOSS].append(kl_loss.item())
            logs[keys.ENTROPY_LOSS].append(entropy_loss.item())
            logs[keys.CLIP_FRACTION].append(clip_fraction)
            logs[keys.APPROX_KL].append(kl.item())
        logs[keys.GRAD_NORM].append(policy.optimizer_step())

    def policy_loss(self, logp: torch.Tensor, batch: TokenBatch) -> tuple[torch.Tensor, float]:
        """The clipped pg_loss averaged over the batch's rows, and the fraction of tokens whose ratio was clipped."""
        mask = batch.completion_mask
        ratio = torch.exp(logp - batch.behaviour_logprobs)  # (b, L-1)
        advantages = batch.rewards[:, None]  # (b, 1)
        unclipped = -ratio * advantages  # (b, L-1)
        clipped = -ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages  # (b, L-1)
        pg_loss = normalized_sum(torch.max(unclipped, clipped), mask, self.max_generation_len).mean()
        with torch.no_grad():
            clip_fraction = masked_mean(((ratio - 1).abs() > self.clip_eps).float(), mask).item()
        return pg_loss, clip_fraction

    def state_dict(self) -> dict[str, Any]:
        """The minibatch shuffling RNG's state."""
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the shuffling RNG."""
        restore_rng(self.rng, state["rng"])
