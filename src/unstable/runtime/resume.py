"""Resume state on disk: nested state as safetensors + JSON, written atomically, and the pointer to the latest.

A run directory holds `state/step-<k>/` for each saved learner step `k` (one `<part>.safetensors` and one
`<part>.json` per component: learner, pool, buffer, tracker) and `state/latest.json`, `{"step": k}`. Each state
directory is written as `step-<k>.tmp` and renamed into place, and the pointer is written to a temporary file
and renamed, so a kill at any moment leaves the previous state whole. Nothing is pickled: tensors go to
safetensors, everything else (dict keys of any JSON type, tuples, RNG states) to tagged JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from unstable.config import ConfigError

STATE_DIR = "state"
LATEST = "latest.json"
PARTS = ("learner", "pool", "buffer", "tracker")
# test hook: "<point>:<step>" pauses the run at `point` ('warm-start': the warm start's SFT pass `step` is done, its
# checkpoint not yet saved; 'state-write': the state is written to its temporary directory but not yet renamed;
# 'after-log': the step's row is written but its state not yet) and touches `<run_dir>/.paused`, so a test can
# kill the process there
PAUSE_ENV = "UNSTABLE_TEST_PAUSE_AT"
PAUSE_MARKER = ".paused"


class ResumeError(ConfigError):
    """A run directory that cannot be resumed (no config, a corrupt or missing state file)."""


def encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` as JSON-ready data; its tensors move into `tensors` under fresh names."""
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot save a {type(obj).__name__} in resume state")


def decode(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `encode`."""
    if isinstance(data, list):
        return [decode(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if "__tensor__" in data:
        return tensors[data["__tensor__"]]
    if "__tuple__" in data:
        return tuple(decode(v, tensors) for v in data["__tuple__"])
    return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in data["__dict__"]}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def save_part(state: Any, directory: Path, name: str) -> None:
    """Write `state` as `directory/name.safetensors` (its tensors) and `directory/name.json` (the rest)."""
    tensors: dict[str, torch.Tensor] = {}
    data = encode(state, tensors)
    save_file(tensors, directory / f"{name}.safetensors")
    (directory / f"{name}.json").write_text(json.dumps(data))


def load_part(directory: Path, name: str) -> Any:
    """Read what `save_part` wrote; a missing or unreadable file raises ResumeError naming it."""
    json_path, tensor_path = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        return decode(json.loads(json_path.read_text()), load_file(tensor_path))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise ResumeError(f"resume state {directory}/{name} is corrupt or missing: {exc}") from None


def write_json_atomically(path: Path, data: Any) -> None:
    """Write JSON to a temporary file, flush it to disk, rename it over `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_run_state(run_dir: Path, step: int, parts: dict[str, Any]) -> Path:
    """Write `state/step-<step>/` atomically, then point `state/latest.json` at it; returns the directory."""
    final = run_dir / STATE_DIR / f"step-{step}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, state in parts.items():
        save_part(state, tmp, name)
    pause_for_test(run_dir, "state-write", step)
    if final.exists():  # a step redone after a kill replaces its unreferenced earlier copy
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json_atomically(run_dir / STATE_DIR / LATEST, {"step": step})
    return final


def latest_state(run_dir: Path) -> tuple[int, Path] | None:
    """The step and directory of the last complete state, None when none was saved; checks every file's header
    so a corrupt state fails here, before any actor starts."""
    pointer = run_dir / STATE_DIR / LATEST
    if not pointer.exists():
        return None
    try:
        step = int(json.loads(pointer.read_text())["step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"resume pointer {pointer} is corrupt: {exc!r}") from None
    directory = pointer.parent / f"step-{step}"
    for name in PARTS:
        _check_part(directory, name)
    return step, directory


def _check_part(directory: Path, name: str) -> None:
    json_path, tensor_path = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        json.loads(json_path.read_text())
        with safe_open(tensor_path, "pt") as f:
            f.keys()
    except (OSError, ValueError, SafetensorError) as exc:
        raise ResumeError(f"resume state {tensor_path.parent}/{name} is corrupt or missing: {exc}") from None


def saved_steps(directory: Path, prefix: str) -> list[int]:
    """The steps `k` of the complete `prefix<k>` entries of `directory` (temporary `.tmp` ones excluded)."""
    if not directory.exists():
        return []
    names = (p.name.removeprefix(prefix) for p in directory.iterdir() if p.name.startswith(prefix))
    return sorted(int(n) for n in names if n.lstrip("-").isdigit())


def prune(directory: Path, prefix: str, keep: Callable[[int], bool]) -> list[int]:
    """Delete the `prefix<k>` entries of `directory` whose step `keep` rejects; returns the deleted steps."""
    deleted = [k for k in saved_steps(directory, prefix) if not keep(k)]
    for k in deleted:
        shutil.rmtree(directory / f"{prefix}{k}")
    return deleted


def pause_for_test(run_dir: Path, point: str, step: int) -> None:
    """The test hook of `PAUSE_ENV`: at the named point and step, touch the marker and wait to be killed."""
    if os.environ.get(PAUSE_ENV) == f"{point}:{step}":
        (run_dir / PAUSE_MARKER).touch()
        while True:
            time.sleep(1.0)
