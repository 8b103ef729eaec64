"""Reward transforms in three stages, each an ordered list of small callables returning new values.

1. Final (`ComposeFinalRewardTransforms`): the game-level reward dict `{player_id: reward}`.
2. Step (`ComposeStepRewardTransforms`): each `Step` after its final reward is known (shaping).
3. Sampling (`ComposeSamplingRewardTransforms`): the list of steps just before a batch is returned.

Transforms never edit their input: steps are frozen and are replaced with `dataclasses.replace`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from unstable.records import Step


class FinalRewardTransform(ABC):
    """Maps a game's reward dict to a new reward dict."""

    @abstractmethod
    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]: ...


class StepRewardTransform(ABC):
    """Maps one step (its `reward` already set from the final stage) to a new step."""

    @abstractmethod
    def __call__(self, step: Step, env_id: str | None = None) -> Step: ...


class SamplingRewardTransform(ABC):
    """Maps the steps of a batch to new steps (e.g. normalisation across the batch)."""

    @abstractmethod
    def __call__(self, steps: list[Step]) -> list[Step]: ...


class ComposeFinalRewardTransforms:
    """Applies final-stage transforms in order."""

    def __init__(self, transforms: Sequence[FinalRewardTransform]):
        self.transforms = list(transforms)

    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]:
        for transform in self.transforms:
            x = transform(x, env_id=env_id)
        return x


class ComposeStepRewardTransforms:
    """Applies step-stage transforms in order."""

    def __init__(self, transforms: Sequence[StepRewardTransform]):
        self.transforms = list(transforms)

    def __call__(self, step: Step, env_id: str | None = None) -> Step:
        for transform in self.transforms:
            step = transform(step, env_id=env_id)
        return step


class ComposeSamplingRewardTransforms:
    """Applies sampling-stage transforms in order."""

    def __init__(self, transforms: Sequence[SamplingRewardTransform]):
        self.transforms = list(transforms)

    def __call__(self, steps: list[Step]) -> list[Step]:
        for transform in self.transforms:
            steps = transform(steps)
        return steps


class WinDrawLossFormatter(FinalRewardTransform):
    """Rewards +1 for the best score at the table, -1 for the worst, 0 for a draw (all equal)."""

    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]:
        best, worst = max(x.values()), min(x.values())
        if best == worst:
            return {pid: 0.0 for pid in x}
        return {pid: 1.0 if r == best else -1.0 if r == worst else 0.0 for pid, r in x.items()}
