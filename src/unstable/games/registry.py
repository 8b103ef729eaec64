"""Which TextArena env ids exist, checked when a config is loaded rather than mid-run."""

from __future__ import annotations

import difflib
from functools import lru_cache


@lru_cache(maxsize=1)
def available_env_ids() -> tuple[str, ...]:
    """All env ids TextArena registers (base, `-train` and `-raw` variants)."""
    from textarena.envs.registration import ENV_REGISTRY

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
