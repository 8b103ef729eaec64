"""Play one game between agents and record it: the plain function every collector worker runs."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping
from dataclasses import replace

from unstable.agents.base import Agent
from unstable.games.registry import make_env
from unstable.records import Decision, EnvSpec, GameRecord, Step

log = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 200


def play_episode(
    spec: EnvSpec,
    agents: Mapping[int, Agent],
    seed: int,
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    is_eval: bool = False,
    learner_player_ids: tuple[int, ...] = (),
) -> GameRecord:
    """Play `spec` with `agents[player_id]` in each seat and return the finished GameRecord.

    Never raises for a game-level failure: an env or agent that crashes yields a GameRecord with `error`
    set (and the error logged), so one bad game cannot kill a run. A game still running after `max_turns`
    decisions is closed as a draw with `truncated=True` (some envs, e.g. Poker, can loop forever).
    """
    start = time.perf_counter()
    players = {pid: agent.name for pid, agent in agents.items()}
    steps: list[Step] = []

    def record(rewards, game_info=None, error=None, truncated=False) -> GameRecord:
        return GameRecord(
            env_id=spec.env_id,
            seed=seed,
            players=players,
            steps=tuple(steps),
            rewards=rewards,
            game_info=game_info or {},
            is_eval=is_eval,
            learner_player_ids=learner_player_ids,
            error=error,
            truncated=truncated,
            wall_seconds=time.perf_counter() - start,
        )

    try:
        env = make_env(spec.env_id)
        env.reset(num_players=spec.num_players, seed=seed)
        done = False
        while not done:
            if len(steps) >= max_turns:
                return record({pid: 0.0 for pid in agents}, truncated=True)
            player_id, observation = env.get_observation()
            decision = agents[player_id].act(observation)
            done, _ = env.step(decision.action)
            invalid = _last_move_was_invalid(env)
            steps.append(_make_step(spec.env_id, player_id, len(steps), observation, decision, invalid))
        rewards, game_info = env.close()
    except Exception as exc:  # noqa: BLE001 - any game-level failure becomes a failed record
        log.error("game %s seed=%d failed after %d steps: %s", spec.env_id, seed, len(steps), exc)
        return record({}, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    if rewards is None:
        return record({}, game_info, error="env closed without rewards")
    steps[:] = _mark_final_invalid_moves(steps, game_info)
    return record({int(pid): float(r) for pid, r in rewards.items()}, game_info)


def _last_move_was_invalid(env) -> bool:
    """TextArena keeps `error_count > 0` on its state after an invalid move it allowed a retry for."""
    state = getattr(env, "state", None)
    return bool(getattr(state, "error_count", 0))


def _mark_final_invalid_moves(steps: list[Step], game_info: dict) -> list[Step]:
    """The move that ended a game as invalid leaves error_count reset; game_info names the offender."""

    offenders = {int(pid) for pid, info in (game_info or {}).items() if info.get("invalid_move")}
    marked = list(steps)
    for pid in offenders:
        for i in range(len(marked) - 1, -1, -1):
            if marked[i].player_id == pid:
                marked[i] = replace(marked[i], invalid_move=True)
                break
    return marked


def _make_step(env_id: str, player_id: int, turn: int, observation: str, d: Decision, invalid: bool) -> Step:
    return Step(
        env_id=env_id,
        player_id=player_id,
        turn=turn,
        observation=observation,
        action=d.action,
        raw_output=d.raw_output,
        prompt=d.prompt,
        prompt_token_ids=d.prompt_token_ids,
        completion_token_ids=d.completion_token_ids,
        behaviour_logprobs=d.behaviour_logprobs,
        format_ok=d.format_ok,
        invalid_move=invalid,
        checkpoint_uid=d.checkpoint.uid if d.checkpoint else None,
        policy_version=d.checkpoint.version if d.checkpoint else 0,
        generation_seconds=d.generation_seconds,
    )
