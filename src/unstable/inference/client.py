"""Several inference servers behind one `generate`: each game stays on one server while the load allows.

The routing rule (cache affinity within a bounded load imbalance, as SGLang's cache-aware router does): a request
without a game goes to the server with the fewest requests in flight (ties in turn, so sequential callers still
use every server). A game's first request does the same, and the game stays on that server, where the prefix
cache holds its earlier prompts (every prompt of a TextArena game repeats the game so far), unless that server has
more than `IMBALANCE_FACTOR` times the least busy server's requests in flight plus `IMBALANCE_SLACK`: then the
game moves to the least busy one and stays there. `end_game` forgets a game, so the client holds only the games
in flight, however long the run.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
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


class InferenceClient:
    """Routes requests over `servers` (InferenceServers or proxies to their actors) by game, within a load bound
    (the module docstring has the rule); with `by_game=False` every request goes to the least busy server.

    It pickles (to be handed to the Collector actor); each copy counts only the requests it sent itself and keeps
    its own games.
    """

    def __init__(self, servers: Sequence[Any], by_game: bool = True):
        if not servers:
            raise ValueError("InferenceClient needs at least one server")
        self.servers = list(servers)
        self.by_game = by_game
        self._outstanding = [0] * len(self.servers)
        self._games: dict[int, int] = {}  # game -> the server it stays on, for the games in flight
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request on its game's server, or the least busy one (blocking)."""
        index = self._pick(request.game if self.by_game else None)
        try:
            return self.servers[index].generate(request)
        finally:
            with self._lock:
                self._outstanding[index] -= 1

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

    def _pick(self, game: int | None) -> int:
        """The server for one request of `game` (None: no game), counted in flight there."""
        with self._lock:
            home = self._games.get(game)
            if home is None or self._overloaded(home):
                home = self._least_busy()
                if game is not None:
                    self._games[game] = home
            self._outstanding[home] += 1
            return home

    def _overloaded(self, index: int) -> bool:
        """Whether server `index` has too many requests in flight beside the least busy one to keep its games."""
        return self._outstanding[index] > IMBALANCE_FACTOR * min(self._outstanding) + IMBALANCE_SLACK

    def _least_busy(self) -> int:
        """The server with the fewest requests in flight; ties in turn."""
        first = next(self._turn) % len(self.servers)
        order = [(first + k) % len(self.servers) for k in range(len(self.servers))]
        return min(order, key=self._outstanding.__getitem__)

    def __getstate__(self):
        return {"servers": self.servers, "by_game": self.by_game}

    def __setstate__(self, state):
        self.__init__(state["servers"], state["by_game"])
