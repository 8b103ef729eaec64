"""Branched games: G continuations from one copied decision state, the groups of GRPO-style baselines.

The original UnstableBaselines README's "dynamic GRPO rollouts": play a game up to a learner decision, deep-copy
the env there and let G copies continue independently. The G decisions taken in the copied state saw the same
observation, so they form a group (one `group_id`) whose mean reward is a baseline for each of them
(`algorithms.GroupBaseline`).
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import replace

from unstable.games.agent import Agent
from unstable.games.episode import DEFAULT_MAX_TURNS, GameRecorder, play_turns, start_env, state_group_id
from unstable.records import EnvSpec, GameRecord, Step

log = logging.getLogger(__name__)


def random_branch_turn(window: int = 6) -> Callable[[int], int]:
    """A branch-turn selector: from the game seed, a turn drawn uniformly from `[0, window)`."""
    return lambda seed: random.Random(seed).randrange(window)


def play_branched_episode(
    spec: EnvSpec,
    agents: Mapping[int, Agent],
    seed: int,
    group_size: int,
    *,
    branch_turn_selector: Callable[[int], int] | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    is_eval: bool = False,
    learner_player_ids: tuple[int, ...] = (),
) -> list[GameRecord]:
    """Play `spec` to a learner decision, then finish it `group_size` times from copies of that state.

    The branch is the first decision of a seat in `learner_player_ids` at or after the turn
    `branch_turn_selector(seed)` picks (default `random_branch_turn()`). The G decisions at the branch share
    the `group_id` "<env_id>:<seed>:<turn>". The first record holds the whole game; the others hold only their
    steps from the branch on, so the shared prefix is trained on once. Each copy carries the game's own random
    states as they were at the branch (`games.chance`), so the copies face the same chance events (e.g. later
    Kuhn Poker deals), whatever other games draw meanwhile, and differ only through the agents' choices.

    One plain record comes back instead when the game ends before a learner decides at or after that turn, or
    when the env cannot be deep-copied (logged): its decisions carry no group and baselines fall back to per
    env and role. Like `play_episode`, a game-level failure gives a failed record instead of raising.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    branch_turn = (branch_turn_selector or random_branch_turn())(seed)
    game = GameRecorder(spec, agents, seed, is_eval, learner_player_ids)
    at_branch = lambda turn, pid: turn >= branch_turn and pid in learner_player_ids  # noqa: E731
    prefix: list[Step] = []
    try:
        env = start_env(spec, seed)
        status = play_turns(env, agents, spec, prefix, max_turns, stop_before=at_branch)
        copies = _copies(env, group_size) if status == "stopped" else None
        if copies is None:
            status = play_turns(env, agents, spec, prefix, max_turns) if status == "stopped" else status
            return [game.finish(env, prefix, status)]
    except Exception as exc:  # noqa: BLE001 - any game-level failure becomes a failed record
        return [game.failure(prefix, exc)]
    group_id = state_group_id(spec.env_id, seed, len(prefix))
    return [
        _play_branch(env_copy, game, prefix, group_id, max_turns, keep_prefix=g == 0)
        for g, env_copy in enumerate(copies)
    ]


def _copies(env, n: int) -> list | None:
    """`n` deep copies of `env`, or None (logged) when the env cannot be copied."""
    try:
        return [copy.deepcopy(env) for _ in range(n)]
    except Exception as exc:  # noqa: BLE001 - any env may hold something deepcopy refuses
        log.warning("cannot deep-copy %s for branching (%r); playing it unbranched", type(env).__name__, exc)
        return None


def _play_branch(
    env, game: GameRecorder, prefix: list[Step], group_id: str, max_turns: int, keep_prefix: bool
) -> GameRecord:
    """Finish one copy of the game from the branch; tag the branch decision with `group_id`."""
    steps = list(prefix)
    try:
        record = game.finish(env, steps, play_turns(env, game.agents, game.spec, steps, max_turns))
    except Exception as exc:  # noqa: BLE001
        return game.failure(steps, exc)
    branch = len(prefix)
    tagged = [replace(s, group_id=group_id) if s.turn == branch else s for s in record.steps]
    return replace(record, steps=tuple(tagged if keep_prefix else tagged[branch:]))
