"""Each game's own chance: its own Python and numpy generators, which the global ones route to during its env calls.

TextArena envs draw chance from process-wide generators: Python's `random` (which `State.__init__` re-seeds on
reset, and which Kuhn Poker's deals draw from inside `step`) and, in a few envs, numpy's `np.random`. The collector
plays many games on threads, so a game's draws would depend on what its neighbours drew.

So a game owns a `random.Random` and a numpy `RandomState` seeded by its seed, and every env call (`reset`,
`get_observation`, `step`, `close`) runs with the game set as its thread's current game. Routing, installed once
(`install_routing`), sends the global generators' draws on that thread to the game's own: the hidden instance behind
`random.*` becomes a `Random` whose methods ask for the current game's generator (so does a method imported by name,
`from random import shuffle`, since its draws go through the instance's `getrandbits` and `random`), and each
`np.random.*` function asks for the current game's `RandomState`. On a thread with no current game, and for code
outside env calls, they draw from their own states as before. No lock is held: an env that waits for a service in
its calls (TextArena's Debate asks a jury of remote models) waits beside the others, not in line behind them.

Not routed: Python's `random` and `getrandbits` imported by name before routing (C methods bound to the instance),
and numpy functions imported by name (`from numpy.random import rand`); TextArena imports none
(`tests/test_games.py` checks its env modules). A deep copy of the env (a branch of `games.branching`) copies its
generators, so every copy meets the same chance events.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

_current = threading.local()  # `.game`: the OwnRandomEnv whose env call runs on this thread (unset: none)
_NUMPY_GLOBAL = np.random.mtrand._rand  # the RandomState behind np.random.rand, np.random.seed, ...
_PYTHON_METHODS = ("random", "getrandbits", "seed", "getstate", "setstate", "randbytes", "gauss", "binomialvariate")


@lru_cache(maxsize=1)
def install_routing() -> None:
    """Route the global generators' draws to the current game's own (see the module docstring); once per process."""
    methods = {n: _python_method(n) for n in _PYTHON_METHODS if hasattr(random.Random, n)}  # by Python version
    routed = type("RoutedRandom", (type(random._inst),), methods)
    random._inst.__class__ = routed
    for name in dir(random):
        if getattr(getattr(random, name), "__self__", None) is random._inst:
            setattr(random, name, getattr(random._inst, name))  # now bound to the routed methods
    for name in dir(np.random):
        if getattr(getattr(np.random, name), "__self__", None) is _NUMPY_GLOBAL:
            setattr(np.random, name, _numpy_function(name, getattr(np.random, name)))


def _python_method(name: str) -> Callable[..., Any]:
    base = getattr(random.Random, name)

    def method(self, *args, **kwargs):
        game = getattr(_current, "game", None)
        return base(self, *args, **kwargs) if game is None else getattr(game.python, name)(*args, **kwargs)

    method.__name__, method.__doc__ = name, base.__doc__
    return method


def _numpy_function(name: str, default: Callable[..., Any]) -> Callable[..., Any]:
    def function(*args, **kwargs):
        game = getattr(_current, "game", None)
        return default(*args, **kwargs) if game is None else getattr(game.numpy, name)(*args, **kwargs)

    function.__name__, function.__doc__, function.__wrapped__ = name, default.__doc__, default
    return function


class OwnRandomEnv:
    """A TextArena env that draws its chance from its own generators, seeded by `seed` (see the module)."""

    def __init__(self, env, seed: int):
        install_routing()
        self.env = env
        self.reseed(seed)

    @property
    def state(self):
        """The wrapped env's TextArena state (reading it draws nothing)."""
        return self.env.state

    def reseed(self, seed: int) -> None:
        """Draw this game's chance from now on from fresh generators seeded by `seed` (a copy's own later events)."""
        self.python = random.Random(seed)
        self.numpy = np.random.RandomState(np.random.MT19937(seed % 2**64))

    def reset(self, num_players: int, seed: int | None = None):
        """TextArena's `reset` (its re-seeding of `random` seeds this game's generator)."""
        return self._with_own_chance(self.env.reset, num_players=num_players, seed=seed)

    def get_observation(self):
        """TextArena's `get_observation`: `(player_id, observation)`."""
        return self._with_own_chance(self.env.get_observation)

    def step(self, action: str):
        """TextArena's `step`: `(done, info)`."""
        return self._with_own_chance(self.env.step, action)

    def close(self):
        """TextArena's `close`: `(rewards, game_info)`."""
        return self._with_own_chance(self.env.close)

    def _with_own_chance(self, call: Callable[..., Any], *args, **kwargs) -> Any:
        outer = getattr(_current, "game", None)
        _current.game = self
        try:
            return call(*args, **kwargs)
        finally:
            _current.game = outer
