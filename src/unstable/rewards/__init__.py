"""Reward transforms: final (game level), step (shaping) and sampling (batch level) stages."""

from unstable.rewards.transforms import (
    BaselineByGroup,
    BaselineByObservation,
    ComposeFinalRewardTransforms,
    ComposeSamplingRewardTransforms,
    ComposeStepRewardTransforms,
    DiscountLaterDecisions,
    FinalRewardTransform,
    NormalizeRewardsByEnv,
    NormalizeRewardsByOpponent,
    PenaltyForInvalidMove,
    RewardForFormat,
    RoleAdvantageByEnvFormatter,
    RoleAdvantageFormatter,
    SamplingRewardTransform,
    StepRewardTransform,
    WinDrawLossFormatter,
)

TRANSFORMS = {
    cls.__name__: cls
    for cls in (
        WinDrawLossFormatter,
        RoleAdvantageFormatter,
        RoleAdvantageByEnvFormatter,
        DiscountLaterDecisions,
        RewardForFormat,
        PenaltyForInvalidMove,
        NormalizeRewardsByEnv,
        NormalizeRewardsByOpponent,
        BaselineByObservation,
        BaselineByGroup,
    )
}


def build_transform(name: str, args: dict | None = None):
    """Instantiate a reward transform by class name; unknown names raise with the valid ones."""
    if name not in TRANSFORMS:
        raise ValueError(f"unknown reward transform {name!r}; valid: {sorted(TRANSFORMS)}")
    return TRANSFORMS[name](**(args or {}))


__all__ = [
    "TRANSFORMS",
    "BaselineByGroup",
    "BaselineByObservation",
    "build_transform",
    "ComposeFinalRewardTransforms",
    "ComposeSamplingRewardTransforms",
    "ComposeStepRewardTransforms",
    "DiscountLaterDecisions",
    "FinalRewardTransform",
    "NormalizeRewardsByEnv",
    "NormalizeRewardsByOpponent",
    "PenaltyForInvalidMove",
    "RewardForFormat",
    "RoleAdvantageByEnvFormatter",
    "RoleAdvantageFormatter",
    "SamplingRewardTransform",
    "StepRewardTransform",
    "WinDrawLossFormatter",
]
