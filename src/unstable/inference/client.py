"""Several inference servers behind one `generate`: each request goes to the server with the fewest in flight."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from unstable.inference.server import merge_stats
from unstable.records import GenerationRequest, GenerationResult


class InferenceClient:
    """Spreads requests over `servers` (InferenceServers or proxies to their actors), least outstanding first.

    Ties go round-robin, so sequential callers still use every server. It pickles (to be handed to the
    Collector actor); each copy counts only the requests it sent itself.
    """

    def __init__(self, servers: Sequence[Any]):
        if not servers:
            raise ValueError("InferenceClient needs at least one server")
        self.servers = list(servers)
        self._outstanding = [0] * len(self.servers)
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request on the least busy server (blocking)."""
        index = self._pick()
        try:
            return self.servers[index].generate(request)
        finally:
            with self._lock:
                self._outstanding[index] -= 1

    def metrics(self) -> dict[str, float]:
        """The servers' throughput since the previous call, merged into one row (see `InferenceServer.stats`)."""
        return merge_stats([server.stats(reset=True) for server in self.servers])

    def _pick(self) -> int:
        with self._lock:
            first = next(self._turn) % len(self.servers)
            order = [(first + k) % len(self.servers) for k in range(len(self.servers))]
            index = min(order, key=self._outstanding.__getitem__)
            self._outstanding[index] += 1
            return index

    def __getstate__(self):
        return {"servers": self.servers}

    def __setstate__(self, state):
        self.__init__(state["servers"])
