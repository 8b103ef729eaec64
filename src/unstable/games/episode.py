"""Play one game between agents and record it: the plain function every collector worker runs."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from unstable.games.agent import Agent
from unstable.games.chance import OwnRandomEnv
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
    game = GameRecorder(spec, agents, seed, is_eval, learner_player_ids)
    steps: list[Step] = []
    try:
        env = start_env(spec, seed)
        return game.finish(env, steps, play_turns(env, agents, spec, steps, max_turns))
    except Exception as exc:  # noqa: BLE001 - any game-level failure becomes a failed record
        return game.failure(steps, exc)


def state_group_id(env_id: str, seed: int, turn: int) -> str:
    """The `group_id` of the decisions sampled from one copied game state: the state at `turn` of game `seed`."""
    return f"{env_id}:{seed}:{turn}"


def start_env(spec: EnvSpec, seed: int) -> OwnRandomEnv:
    """A freshly reset TextArena env for `spec` drawing its chance from its own random states (`games.chance`),
    so games on other threads neither see nor shift its draws."""
    env = OwnRandomEnv(make_env(spec.env_id), seed)
    env.reset(num_players=spec.num_players, seed=seed)
    return env


def play_turns(
    env,
    agents: Mapping[int, Agent],
    spec: EnvSpec,
    steps: list[Step],
    max_turns: int,
    stop_before: Callable[[int, int], bool] | None = None,
) -> str:
    """Play decisions into `steps` until the game is over; returns why it stopped.

    'done': the env finished; 'truncated': `max_turns` decisions were played; 'stopped': `stop_before(turn,
    player_id)` held for the next decision, which is left unplayed (its observation not yet read).
    """
    while True:
        if len(steps) >= max_turns:
            return "truncated"
        if stop_before is not None and stop_before(len(steps), env.state.current_player_id):
            return "stopped"
        player_id, observation = env.get_observation()
        decision = agents[player_id].act(observation)
        done, _ = env.step(decision.action)
        invalid = _last_move_was_invalid(env)
        steps.append(_make_step(spec.env_id, player_id, len(steps), observation, decision, invalid))
        if done:
            return "done"


@dataclass
class GameRecorder:
    """Turns a played (or crashed) game into its GameRecord; the clock starts when it is created."""

    spec: EnvSpec
    agents: Mapping[int, Agent]
    seed: int
    is_eval: bool = False
    learner_player_ids: tuple[int, ...] = ()
    start: float = field(default_factory=time.perf_counter)

    def record(
        self, steps: list[Step], rewards: dict[int, float], game_info=None, error=None, truncated=False
    ) -> GameRecord:
        """A GameRecord of `steps` with the given outcome."""
        return GameRecord(
            env_id=self.spec.env_id,
            seed=self.seed,
            players={pid: agent.name for pid, agent in self.agents.items()},
            steps=tuple(steps),
            rewards=rewards,
            game_info=game_info or {},
            is_eval=self.is_eval,
            learner_player_ids=self.learner_player_ids,
            error=error,
            truncated=truncated,
            wall_seconds=time.perf_counter() - self.start,
        )

    def finish(self, env, steps: list[Step], status: str) -> GameRecord:
        """The record of a game `play_turns` ended with `status`: a draw if truncated, else the env's result."""
        if status == "truncated":
            return self.record(steps, {pid: 0.0 for pid in self.agents}, truncated=True)
        rewards, game_info = env.close()
        if rewards is None:
            return self.record(steps, {}, game_info, error="env closed without rewards")
        marked = _mark_final_invalid_moves(steps, game_info)
        return self.record(marked, {int(pid): float(r) for pid, r in rewards.items()}, game_info)

    def failure(self, steps: list[Step], exc: Exception) -> GameRecord:
        """A failed record for a game that raised `exc` (logged)."""
        log.error("game %s seed=%d failed after %d steps: %s", self.spec.env_id, self.seed, len(steps), exc)
        return self.record(steps, {}, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")


def _last_move_was_invalid(env) -> bool:
    """TextArena keeps `error_count > 0` on its state after an invalid move it allowed a retry for."""
    state = getattr(env, "state", None)
    return bool(getattr(state, "error_count", 0))


def _mark_final_invalid_moves(steps: list[Step], game_info: dict[Any, dict]) -> list[Step]:
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
        temperature=d.temperature,
        top_p=d.top_p,
    )
