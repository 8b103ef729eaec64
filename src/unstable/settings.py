"""The base of every component's settings, the one check that a name is in a registry, and what a number is.

Each component declares its settings once, as a pydantic model in its own folder (`pool/config.py`,
`learner/config.py`, ...), and takes that model whole; `unstable.config` nests them into a run config.
Each choice (algorithm, reward transform, sampling mode, opponent, backend) lives in one registry, and
validation reads the registry, so the allowed values are never written down twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Real

from pydantic import BaseModel, ConfigDict

# The most torch threads one process may ask for: no machine has more cores, and threads beyond the cores only
# contend (a typo such as 1000000 would otherwise start a million OS threads).
MAX_THREADS = 1024


class Settings(BaseModel):
    """Strict settings: an unknown key is an error naming it, so a typo never falls back to a default."""

    model_config = ConfigDict(extra="forbid")


def check_registered(value: str, registry: Iterable[str], what: str) -> str:
    """`value` if `registry` holds it, else a ValueError naming the value and the valid names."""
    names = sorted(registry)
    if value not in names:
        raise ValueError(f"unknown {what} {value!r}; valid: {names}")
    return value


def is_number(value: object) -> bool:
    """True for an int or float (any real number type), False for a bool, which Python counts as an int."""
    return isinstance(value, Real) and not isinstance(value, bool)
