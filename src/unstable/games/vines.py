"""Vines: Monte Carlo continuations from a game's own decision states, so that each move gets its own credit.

VinePPO (Kazemnejad et al., ICML 2025) replaces a learned critic with rollouts from intermediate states. Here a game
is played to its end as usual, the env copied before each learner decision that may get vines. Afterwards chosen
decisions get `rollouts` continuations each, played from a copy of their state by the same agents, the learner's seat
sampling its own move there. The game's move and its vines' moves at one state share a `group_id`: the mean return
of the others is the state's Monte Carlo value, so a move's advantage is its return minus that value
(`rewards.BaselineByGroup`), the credit of that move rather than of its whole game. A vine's record keeps its steps
from the branch on; only its first move (`GameRecord.vine_turn`) is trained on, the rest measured that move's return.

Which decisions (`VineConfig.decisions`): every learner decision; those whose turn is in a window; or 'spread', one
probe vine at each decision and the other `rollouts - 1` only where the probe's return and the game's differ (the
original README's "least return confidence"). `max_tokens_per_game` caps the extra generation: a vine from turn t is
expected to cost what the game generated from t on. Chance: 'fixed' copies carry the game's random states, so every
vine meets the same later chance events (e.g. the next hand's deal); 'resample' gives each vine its own.
The vines of one round run at once on threads of their own, so they fill the inference engine's batches.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field, model_validator

from unstable.games.agent import Agent
from unstable.games.episode import DEFAULT_MAX_TURNS, GameRecorder, play_turns, start_env, state_group_id
from unstable.records import EnvSpec, GameRecord, Step
from unstable.settings import Settings

log = logging.getLogger(__name__)

# vines of one game played at once (each a thread waiting on the inference engine)
MAX_VINES_AT_ONCE = 16


class VineConfig(Settings):
    """Which learner decisions of a training game get Monte Carlo continuations, how many and at what cost."""

    rollouts: int = Field(0, ge=0, le=64, description="continuations per chosen learner decision (0: no vines)")
    decisions: Literal["all", "window", "spread"] = Field(
        "all",
        description="which learner decisions get vines: 'all'; 'window' (turns first_turn..last_turn); 'spread' "
        "(one probe vine each, the other rollouts - 1 where the probe's return differs from the game's)",
    )
    first_turn: int = Field(0, ge=0, description="'window': the first game turn (0-based, all seats) that gets vines")
    last_turn: int = Field(DEFAULT_MAX_TURNS, ge=0, description="'window': the last game turn that gets vines")
    max_tokens_per_game: int | None = Field(
        None, ge=1, description="extra generated tokens a game's vines may cost (estimated from the game; None: any)"
    )
    chance: Literal["fixed", "resample"] = Field(
        "fixed",
        description="'fixed': each vine meets the game's later chance events; 'resample': each draws its own",
    )

    @model_validator(mode="after")
    def _window_in_order(self) -> VineConfig:
        if self.first_turn > self.last_turn:
            raise ValueError(f"first_turn {self.first_turn} is after last_turn {self.last_turn}")
        return self

    @property
    def enabled(self) -> bool:
        """True when training games get vines."""
        return self.rollouts > 0

    def is_candidate(self, turn: int) -> bool:
        """True when a learner decision at game turn `turn` may get vines."""
        return self.decisions != "window" or self.first_turn <= turn <= self.last_turn


Plan = list[tuple["_Branch", int]]  # vines to play: (branch, how many)


@dataclass(frozen=True)
class _Branch:
    """A learner decision that may get vines: its turn, the env copied before it, and what a vine from it costs."""

    turn: int
    player_id: int
    env: object
    expected_tokens: int


def play_vined_episode(
    spec: EnvSpec,
    agents: Mapping[int, Agent],
    seed: int,
    vines: VineConfig,
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    learner_player_ids: tuple[int, ...] = (),
) -> list[GameRecord]:
    """Play `spec` to its end, then the vines `vines` chooses; the game's record first, then one per vine.

    The game's steps at decisions that got vines carry the group id "<env_id>:<seed>:<turn>" of their vines. An env
    that cannot be deep-copied plays on without vines (logged). Like `play_episode`, a failure gives a failed record
    instead of raising (a failed vine only loses that vine).
    """
    game = GameRecorder(spec, agents, seed, False, learner_player_ids)
    steps: list[Step] = []
    states: dict[int, object] = {}  # turn -> the env as it was before the learner's decision there

    def new_candidate(turn: int, player_id: int) -> bool:
        return player_id in learner_player_ids and vines.is_candidate(turn) and turn not in states

    try:
        env = start_env(spec, seed)
        status = "stopped"
        while status == "stopped":  # stop before each candidate decision, copy the env, play on
            status = play_turns(env, agents, spec, steps, max_turns, stop_before=new_candidate)
            if status == "stopped" and not _copy_into(states, len(steps), env):
                status = play_turns(env, agents, spec, steps, max_turns)
        record = game.finish(env, steps, status)
    except Exception as exc:  # noqa: BLE001 - any game-level failure becomes a failed record
        return [game.failure(steps, exc)]
    if record.failed or not states:
        return [record]
    branches = [_Branch(t, steps[t].player_id, state, _tokens_from(steps, t)) for t, state in sorted(states.items())]
    vine_records = _grow(game, record, branches, vines, max_turns)
    return [_tag_vined_moves(record, vine_records), *vine_records]


def _copy_into(states: dict[int, object], turn: int, env) -> bool:
    """Store a deep copy of `env` as the state before `turn`; False (logged) when the env cannot be copied."""
    try:
        states[turn] = copy.deepcopy(env)
    except Exception as exc:  # noqa: BLE001 - any env may hold something deepcopy refuses
        log.warning("cannot deep-copy %s for vines (%r); playing it without", type(env).__name__, exc)
        return False
    return True


def _tokens_from(steps: list[Step], turn: int) -> int:
    """Tokens the game generated from `turn` on: what a vine from there is expected to cost."""
    return sum(len(s.completion_token_ids) for s in steps[turn:])


def _grow(
    game: GameRecorder, record: GameRecord, branches: list[_Branch], vines: VineConfig, max_turns: int
) -> list[GameRecord]:
    """Plan and play the vines within the token budget; their records, in the order they were planned."""
    budget = vines.max_tokens_per_game
    first = vines.rollouts if vines.decisions != "spread" else 1
    plan, budget = _within_budget([(b, first) for b in branches], budget)
    played = _play_all(game, record, plan, vines, max_turns, start=0)
    if vines.decisions == "spread" and vines.rollouts > 1:
        uncertain = [b for b in branches if _returns_differ(record, played, b)]
        more, budget = _within_budget([(b, vines.rollouts - 1) for b in uncertain], budget)
        played += _play_all(game, record, more, vines, max_turns, start=1)
    return played


def _within_budget(wanted: Plan, budget: int | None) -> tuple[Plan, int | None]:
    """As many of the wanted vines (branch, count) as the token budget holds, in order; and the budget left."""
    if budget is None:
        return wanted, None
    plan = []
    for branch, count in wanted:
        cost = max(branch.expected_tokens, 1)
        fits = min(count, budget // cost)
        if fits == 0:
            break
        plan.append((branch, fits))
        budget -= fits * cost
    return plan, budget


def _play_all(
    game: GameRecorder, record: GameRecord, plan: Plan, vines: VineConfig, max_turns: int, start: int
) -> list[GameRecord]:
    """Play every planned vine at once; vine k of a branch is numbered `start + k` (it picks its resampled chance)."""
    jobs = [(branch, start + k) for branch, count in plan for k in range(count)]
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(len(jobs), MAX_VINES_AT_ONCE), thread_name_prefix="vine") as pool:
        return list(pool.map(lambda job: _play_vine(game, record, *job, vines, max_turns), jobs))


def _play_vine(
    game: GameRecorder, record: GameRecord, branch: _Branch, number: int, vines: VineConfig, max_turns: int
) -> GameRecord:
    """One continuation of the game from `branch`; its record holds the steps from the branch on."""
    steps = list(record.steps[: branch.turn])
    try:
        env = copy.deepcopy(branch.env)
        if vines.chance == "resample":
            env.reseed(random.Random(f"{game.seed}:{branch.turn}:{number}").getrandbits(63))
        vine = game.finish(env, steps, play_turns(env, game.agents, game.spec, steps, max_turns))
    except Exception as exc:  # noqa: BLE001 - a failed vine is one lost sample, not a failed game
        vine = game.failure(steps, exc)
    group = state_group_id(record.env_id, record.seed, branch.turn)
    tagged = [replace(s, group_id=group) if s.turn == branch.turn else s for s in vine.steps[branch.turn :]]
    return replace(vine, steps=tuple(tagged), vine_turn=branch.turn)


def _returns_differ(record: GameRecord, vines: list[GameRecord], branch: _Branch) -> bool:
    """True when the game's return and its vines' from `branch` are not all equal (for the branch's player)."""
    returns = {record.rewards[branch.player_id]} | {
        v.rewards[branch.player_id] for v in vines if v.vine_turn == branch.turn and not v.failed
    }
    return len(returns) > 1


def _tag_vined_moves(record: GameRecord, vine_records: list[GameRecord]) -> GameRecord:
    """The game's record with each decision that got a (successful) vine tagged with its group and, when the move
    was valid, its `value_after`: the mean return of the game and its vines at the same player's next vined
    decision (none at its last, whose return is the game's own)."""
    values = {turn: sum(returns) / len(returns) for turn, returns in vine_returns([record, *vine_records]).items()}
    vined_turns = sorted(values)
    steps = []
    for step in record.steps:
        if step.turn in values:
            later = (t for t in vined_turns if t > step.turn and record.steps[t].player_id == step.player_id)
            after = next(later, None)
            value_after = None if after is None or step.invalid_move else values[after]
            group_id = state_group_id(record.env_id, record.seed, step.turn)
            step = replace(step, group_id=group_id, value_after=value_after)
        steps.append(step)
    return replace(record, steps=tuple(steps))


def vine_returns(records: list[GameRecord]) -> dict[int, list[float]]:
    """Each vined decision's returns for its player, the game's first: {turn: [game's, vines'...]} (a played game's
    records, as `play_vined_episode` returns them)."""
    game, vines = records[0], [r for r in records[1:] if not r.failed]
    player = {s.turn: s.player_id for s in game.steps}
    returns = {v.vine_turn: [game.rewards[player[v.vine_turn]]] for v in vines}
    for vine in vines:
        returns[vine.vine_turn].append(vine.rewards[player[vine.vine_turn]])
    return returns
