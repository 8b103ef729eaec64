"""What the vines (`collector.vines`) cost and measured, for the Tracker's rows."""

from __future__ import annotations

import statistics
import threading

from unstable.games.vines import vine_returns
from unstable.records import GameRecord
from unstable.tracking import keys


class VineStats:
    """The vines' share of generation and the values they measured, over the games since the previous `take` (the
    game threads add, the Tracker's row takes, from another thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._vine_tokens = 0
        self._learner_tokens = 0
        self._moves = 0
        self._vined_moves = 0
        self._values: list[float] = []
        self._spreads: list[float] = []

    def add(self, records: list[GameRecord]) -> None:
        """Count one training game's records (the game's first, then its vines')."""
        game, vines = records[0], records[1:]
        learner_moves = [s for s in game.steps if s.player_id in game.learner_player_ids and s.has_tokens]
        returns = vine_returns(records)
        with self._lock:
            self._vine_tokens += sum(len(s.completion_token_ids) for v in vines for s in v.steps)
            self._learner_tokens += sum(len(s.completion_token_ids) for s in learner_moves)
            self._learner_tokens += sum(len(v.steps[0].completion_token_ids) for v in vines if v.steps)
            self._moves += len(learner_moves)
            self._vined_moves += len(returns)
            self._values += [statistics.fmean(r) for r in returns.values()]
            self._spreads += [statistics.pstdev(r) for r in returns.values()]

    def take(self) -> dict[str, float]:
        """{tokens per learner token, vined share of the games' learner moves, spread of the vined moves' values,
        mean spread of returns at one move} since the previous call, under `keys`' names; then start afresh."""
        with self._lock:
            taken = {
                keys.VINE_TOKENS_PER_LEARNER_TOKEN: self._vine_tokens / max(self._learner_tokens, 1),
                keys.VINED_MOVE_SHARE: self._vined_moves / max(self._moves, 1),
                keys.VINE_VALUE_SPREAD: statistics.pstdev(self._values) if self._values else 0.0,
                keys.VINE_RETURN_SPREAD: statistics.fmean(self._spreads) if self._spreads else 0.0,
            }
            self._reset()
        return taken
