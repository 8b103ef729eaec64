"""The StepBuffer's settings: its size and the three reward-transform stages, each a list of registry names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from unstable.settings import Settings, check_registered


class TransformConfig(Settings):
    """A reward transform by registry name (`unstable.rewards.TRANSFORMS`) with its keyword arguments."""

    name: str = Field(description="a name in `unstable.rewards.TRANSFORMS`")
    args: dict[str, Any] = Field({}, description="keyword arguments of its constructor")

    @field_validator("name")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        from unstable.rewards import TRANSFORMS

        return check_registered(value, TRANSFORMS, "reward transform")

    @model_validator(mode="after")
    def _args_fit(self) -> TransformConfig:
        from unstable.rewards import build_transform

        try:
            build_transform(self.name, self.args)
        except TypeError as exc:
            raise ValueError(f"args {self.args} do not fit reward transform {self.name!r}: {exc}") from None
        return self


@dataclass(frozen=True)
class RewardStages:
    """The StepBuffer's three reward stages, built: each a callable (a `Compose...RewardTransforms` of the registry's
    transforms, or any callable of an original-API script), None for an empty stage."""

    final: Callable | None = None
    step: Callable | None = None
    sampling: Callable | None = None


class BufferConfig(Settings):
    """StepBuffer size and the final, step and sampling reward-transform stages (applied in list order).

    A `discount` (the buffer's own setting until the discount became a reward transform; every run config saved
    before has one, which `--resume` re-reads) is moved into a first step-stage `DiscountLaterDecisions`, where
    the buffer applied it, so an old config gives the same rewards; `discount: 1.0`, which changes nothing, is
    dropped."""

    max_buffer_size: int = Field(768, ge=1, description="most steps held; the oldest are dropped first")
    final_reward_transforms: list[TransformConfig] = Field(
        [TransformConfig(name="WinDrawLossFormatter")], description="map a finished game's rewards per player"
    )
    step_reward_transforms: list[TransformConfig] = Field(
        [], description="map each step once its game ended; a discount (`DiscountLaterDecisions`) goes first"
    )
    sampling_reward_transforms: list[TransformConfig] = Field(
        [], description="map a batch just before the learner gets it"
    )

    @model_validator(mode="before")
    @classmethod
    def _discount_as_first_step_transform(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "discount" not in data:
            return data
        data = dict(data)
        discount = data.pop("discount")
        if discount == 1.0:
            return data
        from unstable.rewards import DiscountLaterDecisions

        DiscountLaterDecisions(discount)  # a bad one is refused here, where the message can name `discount`
        first = {"name": "DiscountLaterDecisions", "args": {"discount": discount}}
        return data | {"step_reward_transforms": [first, *data.get("step_reward_transforms", [])]}

    def transform_stages(self) -> RewardStages:
        """The three stages built from the registry (an empty stage: None)."""
        from unstable.rewards import (
            ComposeFinalRewardTransforms,
            ComposeSamplingRewardTransforms,
            ComposeStepRewardTransforms,
            build_transform,
        )

        def stage(items: list[TransformConfig], compose):
            return compose([build_transform(t.name, t.args) for t in items]) if items else None

        return RewardStages(
            final=stage(self.final_reward_transforms, ComposeFinalRewardTransforms),
            step=stage(self.step_reward_transforms, ComposeStepRewardTransforms),
            sampling=stage(self.sampling_reward_transforms, ComposeSamplingRewardTransforms),
        )
