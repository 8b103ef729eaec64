"""Group baseline (GRPO / Dr. GRPO): REINFORCE on each reward minus the mean reward of its group.

    A_i     = r_i - mean_{j in g(i)} r_j             (divided by std_g + eps with `scale_by_std`: GRPO)
    pg_loss = -(1/N) sum_i A_i * sum_t log pi(a_it | s_i, a_i<t) / D

A group is the set of decisions sampled from one copied game state (`games.branching`, shared `group_id`),
so they saw the same prompt, as in GRPO. A step whose group has no other member in the batch (no branching,
an env that could not be copied, a group the buffer split) falls back to the group of the batch's ungrouped
steps of the same env and role. The advantage travels to the loss in the `reward` field of a copy of each
step; the loss itself is `Reinforce`'s. The advantages are computed on the whole batch before data-parallel
learners take their shards of it, so every group keeps its baseline however the batch is split.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable
from dataclasses import replace
from typing import Literal

from unstable.algorithms.reinforce import Reinforce
from unstable.algorithms.trainable import TrainablePolicy
from unstable.records import Step
from unstable.tracking import keys


class GroupBaseline(Reinforce):
    """REINFORCE with group-relative advantages; `scale_by_std=False` is Dr. GRPO, True is GRPO. The reference KL,
    its moving anchor and the importance cap are `Reinforce`'s."""

    def __init__(
        self,
        max_generation_len: int | None = None,
        scale_by_std: bool = False,
        eps: float = 1e-6,
        ref_kl_coef: float | list[list[float]] = 0.0,
        ref_reset_every: int | None = None,
        importance_cap: float | None = None,
        importance_level: Literal["token", "sequence"] = "token",
        ref_mix: float | list[list[float]] | None = None,
    ):
        super().__init__(max_generation_len, ref_kl_coef, ref_reset_every, importance_cap, importance_level, ref_mix)
        self.scale_by_std = scale_by_std
        self.eps = eps

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch on group-relative advantages."""
        advantages, grouped = group_advantages(steps, self.scale_by_std, self.eps)
        metrics = super().update([replace(s, reward=a) for s, a in zip(steps, advantages)], policy)
        return metrics | {keys.GROUPED_FRACTION: grouped / len(steps)}


def group_advantages(steps: list[Step], scale_by_std: bool = False, eps: float = 1e-6) -> tuple[list[float], int]:
    """Each step's reward minus its group's mean reward (over the batch), and how many steps had a branch group.

    With `scale_by_std` the difference is divided by the group's population std plus `eps`. A group of one
    step gets advantage 0.
    """
    sizes = Counter(s.group_id for s in steps if s.group_id is not None)
    group_keys: list[Hashable] = [s.group_id if sizes[s.group_id] > 1 else (s.env_id, s.player_id) for s in steps]
    rewards: dict[Hashable, list[float]] = defaultdict(list)
    for key, step in zip(group_keys, steps):
        rewards[key].append(step.reward)
    stats = {key: (statistics.fmean(r), statistics.pstdev(r)) for key, r in rewards.items()}
    advantages = []
    for key, step in zip(group_keys, steps):
        mean, std = stats[key]
        advantages.append((step.reward - mean) / (std + eps) if scale_by_std else step.reward - mean)
    grouped = sum(sizes[s.group_id] > 1 for s in steps if s.group_id is not None)
    return advantages, grouped
