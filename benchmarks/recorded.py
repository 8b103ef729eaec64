"""A benchmark's settings as its result records them: paths inside the repository relative to its root, so a
result committed from one machine names no folder of that machine. Not a benchmark itself."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def recorded(value: Any) -> Any:
    """A setting's value to record: a path (or a string naming one) under the repository relative to it; lists
    element by element; anything else as it is."""
    if isinstance(value, list | tuple):
        return [recorded(item) for item in value]
    if isinstance(value, Path | str) and Path(value).is_absolute() and Path(value).resolve().is_relative_to(ROOT):
        return str(Path(value).resolve().relative_to(ROOT))
    return str(value) if isinstance(value, Path) else value


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every command-line setting of a benchmark run, recorded."""
    return {name: recorded(value) for name, value in vars(args).items()}
