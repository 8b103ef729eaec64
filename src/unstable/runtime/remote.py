"""Ray glue: components are plain classes; a `RemoteProxy` lets one call another living in a Ray actor."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RemoteProxy:
    """Calls a Ray actor's methods like local ones: `proxy.f(x)` is `ray.get(handle.f.remote(x))`.

    Methods named in `fire_and_forget` return immediately (for logging calls whose result nobody needs). A remote
    method that raises raises the same exception here (chained to Ray's wrapper, which holds the remote traceback),
    so a failed game names the actual cause. Proxies pickle, so they can be handed to other actors.
    """

    def __init__(self, handle: Any, fire_and_forget: Iterable[str] = ()):
        self._handle = handle
        self._nowait = frozenset(fire_and_forget)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._handle, name)
        if name in self._nowait:
            return lambda *args, **kwargs: method.remote(*args, **kwargs)
        return lambda *args, **kwargs: _get(method.remote(*args, **kwargs))

    def __getstate__(self):
        return {"handle": self._handle, "nowait": self._nowait}

    def __setstate__(self, state):
        self._handle = state["handle"]
        self._nowait = state["nowait"]


def _get(ref):
    """`ray.get(ref)`, raising what the remote method raised."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if not isinstance(exc.cause, BaseException):
            raise
        raise exc.cause from exc
