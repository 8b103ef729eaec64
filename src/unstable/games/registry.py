"""Which TextArena env ids exist, checked when a config is loaded rather than mid-run.

Besides TextArena's own ids, unstable registers `KuhnPoker-v0-single` (with its `-train` and `-raw`
variants): one hand of Kuhn Poker per game rewarded in chips (`unstable.games.kuhn_hand`), the game whose
equilibrium value (-1/18 for the first player) and exploitability the evaluation computes. TextArena's
`KuhnPoker-v0` plays three hands and rewards only who holds more chips at the end.
"""

from __future__ import annotations

import difflib
from functools import lru_cache

# new id -> (the TextArena id whose wrappers it keeps, its env class)
EXTRA_ENVS = {"KuhnPoker-v0-single": ("KuhnPoker-v0", "unstable.games.kuhn_hand:KuhnPokerHandEnv")}


@lru_cache(maxsize=1)
def register_extra_envs() -> None:
    """Add `EXTRA_ENVS` to TextArena's registry, with the wrappers of the game they vary (once per process)."""
    from textarena.envs.registration import ENV_REGISTRY, EnvSpec

    for env_id, (base_id, entry_point) in EXTRA_ENVS.items():
        for suffix in ("", "-train", "-raw"):
            wrappers = ENV_REGISTRY[base_id + suffix].default_wrappers
            ENV_REGISTRY.setdefault(env_id + suffix, EnvSpec(env_id + suffix, entry_point, wrappers))


@lru_cache(maxsize=1)
def available_env_ids() -> tuple[str, ...]:
    """All env ids TextArena registers (base, `-train` and `-raw` variants) plus unstable's `EXTRA_ENVS`."""
    from textarena.envs.registration import ENV_REGISTRY

    register_extra_envs()
    return tuple(sorted(ENV_REGISTRY))


def validate_env_id(env_id: str) -> str:
    """Return `env_id` if TextArena knows it; otherwise raise naming close matches and where to see all."""
    ids = available_env_ids()
    if env_id in ids:
        return env_id
    close = difflib.get_close_matches(env_id, ids, n=5)
    hint = f" Did you mean {close}?" if close else ""
    raise ValueError(
        f"unknown TextArena env id {env_id!r}.{hint} {len(ids)} ids are valid; list them with `unstable envs`."
    )


def make_env(env_id: str):
    """Create a TextArena env by id (validated)."""
    import textarena

    return textarena.make(validate_env_id(env_id))
