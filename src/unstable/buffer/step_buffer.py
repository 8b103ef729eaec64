"""The StepBuffer: turns finished games into reward-carrying steps and hands out training batches."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from unstable.buffer.config import BufferConfig, RewardStages
from unstable.records import GameRecord, Step, link_decisions
from unstable.tracking import keys


class StepBuffer:
    """A bounded FIFO of `cfg.max_buffer_size` training steps (oldest dropped first), filled through the reward stages.

    Only steps of the learner's seats that carry model tokens are kept; failed games add nothing. Each step starts
    from its player's final reward (after the final stage), carries the game's facts about its player's later
    decisions (`records.link_decisions`) and is labelled with its opponent (`Step.opponent`: the other seats'
    agent names) for per-opponent baselines, then goes through the step stage. `get_batch` removes a uniformly
    drawn batch and applies the sampling-stage transform to it; steps that share a `group_id` are drawn together,
    so a group-relative baseline sees the whole group. The stages are `cfg`'s transforms, built from the registry,
    unless `stages` gives them built (an original-API script's callables, or none at all).
    """

    def __init__(self, cfg: BufferConfig | None = None, *, stages: RewardStages | None = None, seed: int = 0):
        self.cfg = cfg or BufferConfig()
        stages = stages if stages is not None else self.cfg.transform_stages()
        self.final_transform = stages.final
        self.step_transform = stages.step
        self.sampling_transform = stages.sampling
        self.steps: deque[Step] = deque(maxlen=self.cfg.max_buffer_size)
        self.counters = {
            keys.BUFFER_GAMES_ADDED: 0,
            keys.BUFFER_GAMES_SKIPPED: 0,
            keys.BUFFER_STEPS_ADDED: 0,
            keys.BUFFER_STEPS_DROPPED: 0,
        }
        self._rng = random.Random(seed)
        self._stop_cause: str | None = None  # why collection stopped (None: it goes on)

    def add_game(self, record: GameRecord) -> int:
        """Add the learner's steps of a finished game; returns how many steps were added."""
        if not _trains(record):
            self.counters[keys.BUFFER_GAMES_SKIPPED] += 1
            return 0
        rewards = dict(record.rewards)
        if self.final_transform is not None:
            rewards = self.final_transform(rewards, env_id=record.env_id)
        added = 0
        for step in link_decisions(record.steps):
            if not _trains_on(record, step):
                continue
            step = replace(step, reward=float(rewards[step.player_id]), opponent=_opponent(record, step.player_id))
            if self.step_transform is not None:
                step = self.step_transform(step, env_id=record.env_id)
            if len(self.steps) == self.cfg.max_buffer_size:
                self.counters[keys.BUFFER_STEPS_DROPPED] += 1
            self.steps.append(step)
            added += 1
        self.counters[keys.BUFFER_GAMES_ADDED] += 1
        self.counters[keys.BUFFER_STEPS_ADDED] += added
        return added

    def stop_collection(self, cause: str = "the learner finished its updates") -> None:
        """Tell the collector to start no new games: the learner calls this when its last update is done, the
        collector when its games keep failing (`cause` says which)."""
        self._stop_cause = self._stop_cause or cause

    def collection_stopped(self) -> bool:
        """True after `stop_collection()`."""
        return self._stop_cause is not None

    def stop_cause(self) -> str | None:
        """Why collection stopped (None while it goes on)."""
        return self._stop_cause

    def size(self) -> int:
        """Steps currently stored."""
        return len(self.steps)

    def room(self) -> int:
        """Steps it can still take before the next one added pushes out the oldest."""
        return self.cfg.max_buffer_size - len(self.steps)

    def get_batch(self, batch_size: int) -> list[Step]:
        """Remove and return `batch_size` uniformly drawn steps, after the sampling-stage transform."""
        if batch_size > len(self.steps):
            raise ValueError(f"asked for {batch_size} steps but the buffer holds {len(self.steps)}")
        chosen = self._draw(batch_size)
        batch = [s for i, s in enumerate(self.steps) if i in chosen]
        self.steps = deque((s for i, s in enumerate(self.steps) if i not in chosen), maxlen=self.cfg.max_buffer_size)
        if self.sampling_transform is not None:
            batch = self.sampling_transform(batch)
        return batch

    def _draw(self, batch_size: int) -> set[int]:
        """Indices of whole groups and lone steps in random order; a group is split only to fill the batch."""
        units: dict[object, list[int]] = {}
        for i, step in enumerate(self.steps):
            units.setdefault(step.group_id if step.group_id is not None else i, []).append(i)
        order = list(units.values())
        self._rng.shuffle(order)
        chosen: list[int] = []
        for unit in order:
            if len(chosen) + len(unit) <= batch_size:
                chosen += unit
        taken = set(chosen)
        rest = [i for unit in order for i in unit if i not in taken]
        return taken | set(rest[: batch_size - len(taken)])

    def state_dict(self) -> dict[str, Any]:
        """Counters, the draw RNG and the reward transforms' state (running baselines), for resume. The steps
        themselves are not kept: they came from policies the resumed learner has moved past."""
        return {
            "counters": dict(self.counters),
            "rng": self._rng.getstate(),
            "transforms": [_state(t) for t in (self.final_transform, self.step_transform, self.sampling_transform)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (with the same transforms configured)."""
        self.counters = dict(state["counters"])
        self._rng.setstate(state["rng"])
        stages = (self.final_transform, self.step_transform, self.sampling_transform)
        for transform, saved in zip(stages, state["transforms"]):
            if saved is not None:
                transform.load_state_dict(saved)

    def metrics(self) -> dict[str, float]:
        """Counters, the current size and the capacity, for the tracker."""
        return self.counters | {keys.BUFFER_SIZE: len(self.steps), keys.BUFFER_CAPACITY: self.cfg.max_buffer_size}


def _state(transform: Callable | None) -> Any:
    """A reward stage's `state_dict()`; None for no stage or a plain callable (an original-API script's), which
    keeps none."""
    return transform.state_dict() if hasattr(transform, "state_dict") else None


def steps_to_add(record: GameRecord) -> int:
    """How many steps `StepBuffer.add_game` takes from `record` (0 for a failed or evaluation game)."""
    return sum(_trains_on(record, step) for step in record.steps) if _trains(record) else 0


def _trains(record: GameRecord) -> bool:
    """True for a game whose steps the buffer takes: a training game that finished with rewards."""
    return not (record.failed or record.is_eval or not record.rewards)


def _trains_on(record: GameRecord, step: Step) -> bool:
    """True for a step of `record` the buffer keeps: the learner's, with model tokens (of a vine: its first)."""
    vine_start = record.vine_turn is None or step.turn == record.vine_turn
    return step.player_id in record.learner_player_ids and step.has_tokens and vine_start


def _opponent(record: GameRecord, player_id: int) -> str:
    """The names of the agents in `record`'s other seats, '+'-joined in seat order."""
    return "+".join(name for pid, name in sorted(record.players.items()) if pid != player_id)
