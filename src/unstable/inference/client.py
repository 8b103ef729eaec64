"""Several inference servers behind one `generate`: each game stays on one server while the load allows.

The routing rule (cache affinity within a bounded load imbalance, as SGLang's cache-aware router does): a request
without a game goes to the server with the fewest requests in flight (ties in turn, so sequential callers still
use every server). A game's first request does the same, and the game stays on that server, where the prefix
cache holds its earlier prompts (every prompt of a TextArena game repeats the game so far), unless that server has
more than `IMBALANCE_FACTOR` times the least busy server's requests in flight plus `IMBALANCE_SLACK`: then the
game moves to the least busy one and stays there. `end_game` forgets a game, so the client holds only the games
in flight, however long the run.

A server whose actor is gone (`unavailable(exc)` holds for what its request raised: the process died, Ray restarts
it) rests for `REST_S`: the request goes to another server, and so do its games and new ones. After the rest the
next request to it tells: answered, it is back; refused, it rests again and that request too goes elsewhere. So an
actor's death and restart cost its games no failed request, as long as another server answers.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from unstable.inference.server import idle_stats, merge_stats
from unstable.records import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

# a game leaves its server when that server has more than IMBALANCE_FACTOR x (the least busy one's requests in
# flight) + IMBALANCE_SLACK in flight: up to about twice the least busy server's queue, a few requests waiting
# longer cost less than prefilling the game's whole prompt again elsewhere; the slack keeps a few games in flight
# from hopping between servers over differences of one or two requests
IMBALANCE_FACTOR = 2
IMBALANCE_SLACK = 2
# seconds a server whose actor was gone gets no requests before the next one tries it again
REST_S = 2.0


def _never(exc: BaseException) -> bool:
    """No error says a local server is gone."""
    return False


class InferenceClient:
    """Routes requests over `servers` (InferenceServers or proxies to their actors) by game, within a load bound
    (the module docstring has the rule); with `by_game=False` every request goes to the least busy server.
    `unavailable(exc)` says whether an error a server raised means its actor is gone (a module-level function, so
    the client pickles).

    It pickles (to be handed to the Collector actor); each copy counts only the requests it sent itself and keeps
    its own games.
    """

    def __init__(
        self, servers: Sequence[Any], by_game: bool = True, unavailable: Callable[[BaseException], bool] = _never
    ):
        if not servers:
            raise ValueError("InferenceClient needs at least one server")
        self.servers = list(servers)
        self.by_game = by_game
        self.unavailable = unavailable
        self._outstanding = [0] * len(self.servers)
        self._resting_until = [0.0] * len(self.servers)  # time.monotonic() before which a server gets no requests
        self._games: dict[int, int] = {}  # game -> the server it stays on, for the games in flight
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request on its game's server, or the least busy one (blocking); on another server when that
        one's actor is gone, each server tried at most once."""
        for attempt in range(len(self.servers)):
            index = self._pick(request.game if self.by_game else None)
            try:
                return self.servers[index].generate(request)
            except Exception as exc:
                if attempt + 1 == len(self.servers) or not self.unavailable(exc):
                    raise
                self._rest(index, exc)
            finally:
                with self._lock:
                    self._outstanding[index] -= 1
        raise AssertionError("unreachable: the last attempt returns or raises")

    def end_game(self, game: int) -> None:
        """Forget `game` (it ended): its server is no longer reserved for it. A game not held is ignored."""
        with self._lock:
            self._games.pop(game, None)

    def metrics(self) -> dict[str, float]:
        """The servers' throughput since the previous call, merged into one row (see `InferenceServer.stats`). A
        server that cannot answer (its actor died and Ray restarts it) counts as idle, holding no checkpoint."""
        return merge_stats([self._stats(index) for index in range(len(self.servers))])

    def _stats(self, index: int) -> dict[str, float]:
        try:
            return self.servers[index].stats(reset=True)
        except Exception as exc:  # noqa: BLE001 - one server's row is lost, not the run: the row is logged anyway
            log.warning("inference server %d gave no statistics for this row: %r", index, exc)
            return idle_stats()

    def _rest(self, index: int, exc: Exception) -> None:
        """Send server `index` no requests for `REST_S` seconds: its actor is gone (`exc` says why)."""
        log.warning(
            "inference server %d is unavailable, its requests go to the others for %.0f s: %s", index, REST_S, exc
        )
        with self._lock:
            self._resting_until[index] = time.monotonic() + REST_S

    def _pick(self, game: int | None) -> int:
        """The server for one request of `game` (None: no game), counted in flight there."""
        with self._lock:
            serving = self._serving()
            home = self._games.get(game)
            if home not in serving or self._overloaded(home, serving):
                home = self._least_busy(serving)
                if game is not None:
                    self._games[game] = home
            self._outstanding[home] += 1
            return home

    def _serving(self) -> list[int]:
        """The servers not resting (all of them when every one rests)."""
        now = time.monotonic()
        return [i for i, until in enumerate(self._resting_until) if until <= now] or list(range(len(self.servers)))

    def _overloaded(self, index: int, serving: list[int]) -> bool:
        """Whether server `index` has too many requests in flight beside the least busy one to keep its games."""
        least = min(self._outstanding[i] for i in serving)
        return self._outstanding[index] > IMBALANCE_FACTOR * least + IMBALANCE_SLACK

    def _least_busy(self, serving: list[int]) -> int:
        """The server of `serving` with the fewest requests in flight; ties in turn."""
        first = next(self._turn) % len(serving)
        return min(serving[first:] + serving[:first], key=self._outstanding.__getitem__)

    def __getstate__(self):
        return {"servers": self.servers, "by_game": self.by_game, "unavailable": self.unavailable}

    def __setstate__(self, state):
        self.__init__(state["servers"], state["by_game"], state["unavailable"])
