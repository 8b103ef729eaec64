"""Pacing: how many waiting training games may start, so that the StepBuffer drops no steps it could train on.

A training game starts only while the steps in the buffer plus those the games in flight are expected to add
(games in flight x the running mean of steps per finished training game) stay within the buffer's capacity.
Games in flight always finish. At least one game is in flight whenever the buffer has room, so a learner
waiting for a batch never waits forever (a buffer smaller than one game's steps still gets games).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Pacing:
    """The running mean of steps per finished training game and the rule that uses it.

    `prior_steps`: the mean assumed before the first training game finishes (an upper bound is safe: the first
    games then start a few at a time). `enabled=False`: every waiting game starts at once."""

    def __init__(self, prior_steps: float, enabled: bool = True):
        self.enabled = enabled
        self._prior = prior_steps
        self._steps = 0
        self._games = 0
        self._lock = threading.Lock()  # game threads report, the collector's loop reads
        self.held_back = 0  # training games whose start waited at least one round of the collector's loop

    def game_finished(self, steps: int) -> None:
        """Count one finished training game that added `steps` steps to the buffer (all its branches)."""
        with self._lock:
            self._steps += steps
            self._games += 1

    def mean_steps(self) -> float:
        """Steps per finished training game so far (`prior_steps` before the first)."""
        with self._lock:
            return self._steps / self._games if self._games else self._prior

    def startable(self, waiting: int, in_flight: int, room: int) -> int:
        """How many of `waiting` training games may start with `in_flight` training games running and `room`
        steps left in the buffer before it drops any."""
        if not self.enabled:
            return waiting
        mean = self.mean_steps()
        fits = waiting if mean <= 0 else int((room - in_flight * mean) // mean)
        if in_flight == 0 and room > 0:
            fits = max(fits, 1)
        return max(0, min(waiting, fits))

    def hold(self, arrived: int, still_waiting: int) -> None:
        """Count the games held back in a round where `arrived` slots freed up and `still_waiting` did not start
        (the earliest waiting start first, so at most `arrived` of them are new)."""
        self.held_back += min(arrived, still_waiting)


class HeldSlots:
    """How many training-game slots exist and how many of them pacing holds empty, integrated over time: the
    slot-seconds held back and all slots' seconds since the previous `take` (the collector's loop sets the counts,
    the Tracker's row takes the window, from another thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._slots = 0
        self._held = 0
        self._since = clock()
        self._slot_seconds = 0.0
        self._held_seconds = 0.0

    def set(self, slots: int, held: int) -> None:
        """From now on `slots` training slots exist, `held` of them empty because pacing holds their games back."""
        with self._lock:
            self._advance()
            self._slots, self._held = slots, held

    def take(self) -> tuple[float, float]:
        """(held slot-seconds, all slots' seconds) since the previous take (or construction); a new window starts."""
        with self._lock:
            self._advance()
            window = (self._held_seconds, self._slot_seconds)
            self._held_seconds = self._slot_seconds = 0.0
            return window

    def _advance(self) -> None:
        now = self._clock()
        elapsed, self._since = now - self._since, now
        self._slot_seconds += self._slots * elapsed
        self._held_seconds += self._held * elapsed
