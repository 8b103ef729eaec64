"""Reward transforms in three stages, each an ordered list of small callables returning new values.

1. Final (`ComposeFinalRewardTransforms`): the game-level reward dict `{player_id: reward}`.
2. Step (`ComposeStepRewardTransforms`): each `Step` after its final reward is known (shaping).
3. Sampling (`ComposeSamplingRewardTransforms`): the list of steps just before a batch is returned.

Transforms never edit their input: steps are frozen and are replaced with `dataclasses.replace`.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any

from unstable.records import Step


class Stateless:
    """A transform that keeps no state between calls; stateful transforms override both methods for resume."""

    def state_dict(self) -> dict[str, Any]:
        """What the transform learned from earlier games (nothing here)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output."""


class FinalRewardTransform(Stateless, ABC):
    """Maps a game's reward dict to a new reward dict."""

    @abstractmethod
    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]: ...


class StepRewardTransform(Stateless, ABC):
    """Maps one step (its `reward` already set from the final stage) to a new step."""

    @abstractmethod
    def __call__(self, step: Step, env_id: str | None = None) -> Step: ...


class SamplingRewardTransform(Stateless, ABC):
    """Maps the steps of a batch to new steps (e.g. normalisation across the batch)."""

    @abstractmethod
    def __call__(self, steps: list[Step]) -> list[Step]: ...


class _Compose:
    """An ordered list of transforms whose state is the list of their states."""

    def __init__(self, transforms: Sequence[Stateless]):
        self.transforms = list(transforms)

    def state_dict(self) -> list[dict[str, Any]]:
        """Each transform's `state_dict()`, in order."""
        return [t.state_dict() for t in self.transforms]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Restore each transform from `state_dict()`'s output."""
        if len(state) != len(self.transforms):
            raise ValueError(f"saved state of {len(state)} reward transforms; {len(self.transforms)} are configured")
        for transform, part in zip(self.transforms, state):
            transform.load_state_dict(part)


class ComposeFinalRewardTransforms(_Compose):
    """Applies final-stage transforms in order."""

    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]:
        for transform in self.transforms:
            x = transform(x, env_id=env_id)
        return x


class ComposeStepRewardTransforms(_Compose):
    """Applies step-stage transforms in order."""

    def __call__(self, step: Step, env_id: str | None = None) -> Step:
        for transform in self.transforms:
            step = transform(step, env_id=env_id)
        return step


class ComposeSamplingRewardTransforms(_Compose):
    """Applies sampling-stage transforms in order."""

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


class RoleAdvantageFormatter(FinalRewardTransform):
    """Subtracts a per-role baseline: an EMA of each player id's reward, updated before it is subtracted.

    `b[pid] <- (1 - tau) * b[pid] + tau * r[pid]`, then `r[pid] - b[pid]`; baselines start at 0.
    """

    def __init__(self, tau: float = 0.001):
        self.tau = tau
        self.baselines: dict[Hashable, float] = defaultdict(float)

    def __call__(self, x: dict[int, float], env_id: str | None = None) -> dict[int, float]:
        return {pid: r - self._update(self._key(pid, env_id), r) for pid, r in x.items()}

    def state_dict(self) -> dict[str, Any]:
        """The baselines by key."""
        return {"baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the baselines."""
        self.baselines = defaultdict(float, state["baselines"])

    def _key(self, pid: int, env_id: str | None) -> Hashable:
        return pid

    def _update(self, key: Hashable, reward: float) -> float:
        self.baselines[key] = (1 - self.tau) * self.baselines[key] + self.tau * reward
        return self.baselines[key]


class RoleAdvantageByEnvFormatter(RoleAdvantageFormatter):
    """SPIRAL's role-conditioned advantage: like `RoleAdvantageFormatter` with one EMA per (env, role)."""

    def _key(self, pid: int, env_id: str | None) -> Hashable:
        return (env_id, pid)


class DiscountLaterDecisions(StepRewardTransform):
    """Multiplies a step's reward by `discount ** k`, k the decisions its player makes later in the game
    (`Step.decisions_after`): below 1 the moves that decided the game count most. Put it first in the step stage,
    so the shaping terms after it are not discounted."""

    def __init__(self, discount: float):
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be a number in (0, 1], got {discount!r}")
        self.discount = discount

    def __call__(self, step: Step, env_id: str | None = None) -> Step:
        return replace(step, reward=step.reward * self.discount**step.decisions_after)


class RewardForFormat(StepRewardTransform):
    """Adds `reward` to a step whose completion had the answer format (`format_ok`), `penalty` otherwise."""

    def __init__(self, reward: float = 0.0, penalty: float = 0.0):
        self.reward = reward
        self.penalty = penalty

    def __call__(self, step: Step, env_id: str | None = None) -> Step:
        return replace(step, reward=step.reward + (self.reward if step.format_ok else self.penalty))


class PenaltyForInvalidMove(StepRewardTransform):
    """Adds `penalty` to a step whose move the env rejected (`invalid_move`) and `reward` to every valid one.

    Reading of the original API's `PenaltyForInvalidMove(1.0, -1.0)`: the first argument is the bonus for a valid
    move, the second the (negative) amount for an invalid one, so a valid move gets +1 and an invalid -1.
    """

    def __init__(self, reward: float = 0.0, penalty: float = 0.0):
        self.reward = reward
        self.penalty = penalty

    def __call__(self, step: Step, env_id: str | None = None) -> Step:
        return replace(step, reward=step.reward + (self.penalty if step.invalid_move else self.reward))


class NormalizeRewardsByEnv(SamplingRewardTransform):
    """Subtracts each env's mean reward over the batch; with `z_score` also divides by its (population) std.

    With `by_role` each seat (`Step.player_id`) of an env has its own mean and std: SPIRAL's role-conditioned
    advantage as a batch baseline. In TicTacToe the player who opens wins far more often, so one env-wide
    mean makes nearly every move of the second seat look bad and buries what separates its good games from its
    bad ones.

    With `by_turn` each turn of the game (`Step.turn`) has its own: under a discount (`DiscountLaterDecisions`) an
    opening's advantages are small beside the endgame's, and one env-wide std would leave the opening nearly no
    gradient; per turn every depth of the game gets the same scale.

    With `by_group` the moves sampled from one copied state (`Step.group_id`: vines, branching) have their own, as in
    GRPO: after `BaselineByGroup`, a decision whose moves differ by little (a Queen facing a bet in Kuhn Poker) weighs
    as much in the gradient as one whose moves differ by much (a King's), instead of being drowned by it. Steps with
    no group keep their env's (and seat's, turn's) mean and std.
    """

    def __init__(
        self,
        z_score: bool = False,
        by_role: bool = False,
        by_turn: bool = False,
        by_group: bool = False,
        eps: float = 1e-8,
    ):
        _require_bools(z_score=z_score, by_role=by_role, by_turn=by_turn, by_group=by_group)
        self.z_score = z_score
        self.by_role = by_role
        self.by_turn = by_turn
        self.by_group = by_group
        self.eps = eps

    def __call__(self, steps: list[Step]) -> list[Step]:
        by_key: dict[Hashable, list[float]] = defaultdict(list)
        for step in steps:
            by_key[self._key(step)].append(step.reward)
        stats = {key: (statistics.fmean(r), statistics.pstdev(r)) for key, r in by_key.items()}
        return [replace(s, reward=self._normalize(s.reward, *stats[self._key(s)])) for s in steps]

    def _key(self, step: Step) -> Hashable:
        return (
            self._group(step),
            step.player_id if self.by_role else None,
            step.turn if self.by_turn else None,
            step.group_id if self.by_group else None,
        )

    def _group(self, step: Step) -> Hashable:
        return step.env_id

    def _normalize(self, reward: float, mean: float, std: float) -> float:
        return (reward - mean) / (std + self.eps) if self.z_score else reward - mean


class NormalizeRewardsByOpponent(NormalizeRewardsByEnv):
    """Like `NormalizeRewardsByEnv`, with one mean (and std) per env and opponent (`Step.opponent`).

    Against a mix of fixed opponents the env-wide baseline makes every move played against the strongest one look
    bad, since most of those games are lost; per opponent, a draw against minimax scores above the losses to it and
    a win against the random agent is compared with the other games against the random agent. Every past
    checkpoint is an opponent of its own, so population play is better served by the env-wide baseline.
    """

    def _group(self, step: Step) -> Hashable:
        return (step.env_id, step.opponent)


class BaselineByObservation(SamplingRewardTransform):
    """Subtracts a per-state baseline: the mean reward of the batch's other steps with the same env and observation
    (leave-one-out, as in RLOO); a step whose observation no other step shares gets its env's batch mean instead.

    In Kuhn Poker an observation is an information set (the card and the betting so far), so the baseline takes
    the card's luck out of the reward and leaves what the action changed. Put it before `NormalizeRewardsByEnv`.
    """

    def __call__(self, steps: list[Step]) -> list[Step]:
        return _minus_leave_one_out_mean(steps, lambda s: (s.env_id, s.observation), env_mean_over_all=True)


class BaselineByGroup(SamplingRewardTransform):
    """Subtracts a per-state Monte Carlo value: the mean reward of the batch's other steps with the same `group_id`
    (leave-one-out, as in RLOO), the decisions sampled from one copied game state (`games.vines`,
    `games.branching`). The StepBuffer draws a group into one batch, so a step's group is whole unless the buffer
    dropped part of it. A step with no other member of its group in the batch gets the mean reward of its env's
    such steps instead. With vines this is each move's credit: its return minus the value of the state it was
    chosen in. Put it before `NormalizeRewardsByEnv`, which then scales the advantages.

    `bootstrap`: a move whose vines measured the state it led to (`Step.value_after`, the game's own moves but its
    player's last) counts that value instead of its one return, as VinePPO's advantage V(s') - V(s) does: the
    rest of the game's chance leaves that sample. `value_after` is in the env's own rewards, so use it with no final
    reward transforms.

    `by_action`: a move counts the mean value of its group's moves that chose the same action (`Step.action`, its
    own included), the state's Monte Carlo Q of that action, instead of its own value alone; the baseline stays the
    mean of the others. Where the policy repeats a move in a state (a few cells, two bets), each such move's credit
    then averages over several continuations. The others' moves do not depend on this one, so the estimate keeps
    its expectation.
    """

    def __init__(self, bootstrap: bool = False, by_action: bool = False):
        _require_bools(bootstrap=bootstrap, by_action=by_action)
        self.bootstrap = bootstrap
        self.by_action = by_action

    def __call__(self, steps: list[Step]) -> list[Step]:
        value_of = self._value if self.bootstrap else (lambda step: step.reward)
        centred = _minus_leave_one_out_mean(steps, lambda s: s.group_id, env_mean_over_all=False, value_of=value_of)
        if not self.by_action:
            return centred
        by_action: dict[Hashable, list[float]] = defaultdict(list)
        for step in (s for s in steps if s.group_id):
            by_action[step.group_id, step.action].append(value_of(step))
        action_value = {key: statistics.fmean(values) for key, values in by_action.items()}
        return [
            replace(c, reward=c.reward - value_of(s) + action_value[s.group_id, s.action]) if s.group_id else c
            for c, s in zip(centred, steps, strict=True)
        ]

    @staticmethod
    def _value(step: Step) -> float:
        return step.reward if step.value_after is None else step.value_after


def _require_bools(**flags: object) -> None:
    """Refuse a flag that is not true or false (a string or a number would otherwise pass as truthy)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")


def _minus_leave_one_out_mean(
    steps: list[Step],
    key_of: Callable[[Step], Hashable | None],
    env_mean_over_all: bool,
    value_of: Callable[[Step], float] | None = None,
) -> list[Step]:
    """Each step with its value (`value_of`, default its reward) minus the mean value of the other steps sharing its
    key (`key_of`; None: no key) as its reward. A step with no such other step gets its env's mean value instead:
    over all the env's steps (`env_mean_over_all`) or over the env's steps that have no such other step."""
    value_of = value_of or (lambda step: step.reward)
    by_key: dict[Hashable, list[float]] = defaultdict(list)
    for step in steps:
        if (key := key_of(step)) is not None:
            by_key[key].append(value_of(step))
    alone = lambda step: len(by_key.get(key_of(step), ())) < 2  # noqa: E731
    by_env: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        if env_mean_over_all or alone(step):
            by_env[step.env_id].append(value_of(step))
    env_mean = {env: statistics.fmean(values) for env, values in by_env.items()}

    def baseline(step: Step) -> float:
        same = by_key.get(key_of(step), ())
        return (sum(same) - value_of(step)) / (len(same) - 1) if len(same) > 1 else env_mean[step.env_id]

    return [replace(s, reward=value_of(s) - baseline(s)) for s in steps]
