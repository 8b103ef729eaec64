"""The runtime: wires the components into a topology of Ray actors and runs training on it.

Its names load on first use, so a Ray worker that hosts one light actor (a tracker, a buffer, a pool) imports only
what that actor needs, not torch with the driver.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "RunSummary": "unstable.runtime.driver",
    "resume_training": "unstable.runtime.driver",
    "run": "unstable.runtime.driver",
    "train": "unstable.runtime.driver",
    "Topology": "unstable.runtime.topology",
    "build_topology": "unstable.runtime.topology",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'unstable.runtime' has no attribute {name!r}")
