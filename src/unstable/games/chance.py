"""Each game's own chance: its Python and numpy random states, loaded into the global generators around every env
call.

TextArena envs draw chance from process-wide generators: Python's `random` (which `State.__init__` re-seeds on
reset, and which Kuhn Poker's deals draw from inside `step`) and, in a few envs, numpy's `np.random`. The
collector plays many games on threads, so a game's draws would depend on what its neighbours drew. A per-thread
generator cannot fix this for every env: `random.shuffle` and its siblings are methods bound at import to one
hidden instance (`from random import shuffle` copies that binding into the env's module), and numpy's functions
are bound to its global `RandomState` the same way. What can be swapped is the state of those global instances.

So `OwnRandomEnv` gives a game its own states: every env call (`reset`, `get_observation`, `step`, `close`) runs
under one process-wide lock with the game's states in the global generators, and puts the caller's back after:
Python's by `setstate`/`getstate`, numpy's by pointing its global `RandomState` at the game's own MT19937 bit
generator (`np.random.set_state` would copy 624 words through Python, about 0.2 ms a call). The swaps take about
0.05 ms a call; env calls are short Python and a model generates between them, outside the lock, so the lock
costs little. Repointing drops numpy's cached second Gaussian (the game's and the caller's): a game's normal
draws differ from an unswapped stream's but stay a function of its seed and moves. A deep copy of the env (a
branch of `games.branching`) copies its states, so every copy meets the same chance events. Draws from the
global generators outside env calls while a game runs are not covered (the package's own agents and transforms
use their own generators).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

_GLOBAL_GENERATORS = threading.Lock()  # held while a game's states are loaded into the global generators
_NUMPY_GLOBAL = np.random.mtrand._rand  # the RandomState behind np.random.rand, np.random.seed, ...


class OwnRandomEnv:
    """A TextArena env that draws its chance from its own random states, seeded by `seed` (see the module)."""

    def __init__(self, env, seed: int):
        self.env = env
        self._python_state = random.Random(seed).getstate()
        self._numpy_generator = np.random.MT19937(seed % 2**64)

    @property
    def state(self):
        """The wrapped env's TextArena state (reading it draws nothing)."""
        return self.env.state

    def reseed(self, seed: int) -> None:
        """Draw this game's chance from now on from fresh states seeded by `seed` (a copy's own later events)."""
        self._python_state = random.Random(seed).getstate()
        self._numpy_generator = np.random.MT19937(seed % 2**64)

    def reset(self, num_players: int, seed: int | None = None):
        """TextArena's `reset` (its re-seeding of `random` seeds this game's state)."""
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
        with _GLOBAL_GENERATORS:
            outside = random.getstate(), _NUMPY_GLOBAL._bit_generator
            random.setstate(self._python_state)
            _NUMPY_GLOBAL.__init__(self._numpy_generator)  # np.random.* and np.random.seed now use the game's
            try:
                return call(*args, **kwargs)
            finally:
                self._python_state = random.getstate()
                random.setstate(outside[0])
                _NUMPY_GLOBAL.__init__(outside[1])
