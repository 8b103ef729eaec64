"""Resume state on disk: nested state as safetensors + JSON, written atomically, and the pointer to the latest.

A run directory holds `state/step-<k>/` for each saved learner step `k` (one `<part>.safetensors` and one
`<part>.json` per component: learner, pool, buffer, tracker, and `checkpoints.json`, the checkpoint steps the
state's pool plays, which retention must not delete) and `state/latest.json`, `{"step": k}`. Each state
directory is written as `step-<k>.tmp` and renamed into place, and the pointer is written to a temporary file
and renamed, so a kill at any moment leaves the previous state whole. Nothing is pickled: tensors go to
safetensors, everything else (dict keys of any JSON type, tuples, RNG states) to tagged JSON.

`StateWriter` takes the writing off the learner's path: the caller's `snapshot` copies the state (tensors to
CPU), a background thread writes it, one write at a time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from unstable import atomic
from unstable.config import ConfigError

if TYPE_CHECKING:  # torch loads where tensors are saved or read, not where a run is only driven
    import torch

STATE_DIR = "state"
LATEST = "latest.json"
REFERENCED = "checkpoints.json"
PARTS = ("learner", "pool", "buffer", "tracker")
# test hook: "<point>:<step>" pauses the run at `point` ('warm-start': the warm start's SFT pass `step` is done, its
# checkpoint not yet saved; 'state-write': the state is written to its temporary directory but not yet renamed;
# 'after-log': the step's row is written but its state not yet) and touches `<run_dir>/.paused`, so a test can
# kill the process there
PAUSE_ENV = "UNSTABLE_TEST_PAUSE_AT"
PAUSE_MARKER = ".paused"

log = logging.getLogger(__name__)


class ResumeError(ConfigError):
    """A run directory that cannot be resumed (no config, a corrupt or missing state file)."""


def encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` as JSON-ready data; its tensors move into `tensors` under fresh names."""
    if _is_tensor(obj):
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


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # before torch is imported no tensor exists
    return torch is not None and isinstance(obj, torch.Tensor)


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


Snapshot = dict[str, tuple[Any, dict[str, "torch.Tensor"]]]


def snapshot(parts: dict[str, Any]) -> Snapshot:
    """Each part encoded (`encode`): JSON-ready data and tensors copied to CPU, shared with no live object, so the
    state may change while a thread writes the snapshot."""
    encoded = {}
    for name, state in parts.items():
        tensors: dict[str, torch.Tensor] = {}
        encoded[name] = (encode(state, tensors), tensors)
    return encoded


def save_part(state: Any, directory: Path, name: str) -> None:
    """Write `state` as `directory/name.safetensors` (its tensors) and `directory/name.json` (the rest)."""
    _write_part(*snapshot({name: state})[name], directory, name)


def _write_part(data: Any, tensors: dict[str, torch.Tensor], directory: Path, name: str) -> None:
    from safetensors.torch import save_file

    save_file(tensors, directory / f"{name}.safetensors")
    (directory / f"{name}.json").write_text(json.dumps(data))


def load_part(directory: Path, name: str) -> Any:
    """Read what `save_part` wrote; a missing or unreadable file raises ResumeError naming it."""
    from safetensors.torch import load_file

    json_path, tensor_path = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        return decode(json.loads(json_path.read_text()), load_file(tensor_path))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise ResumeError(f"resume state {directory}/{name} is corrupt or missing: {exc}") from None


def save_run_state(run_dir: Path, step: int, parts: dict[str, Any], referenced: list[int] = ()) -> Path:
    """Write `state/step-<step>/` atomically, then point `state/latest.json` at it; returns the directory.
    `referenced`: the checkpoint steps the state's pool plays (see `referenced_checkpoints`)."""
    return write_snapshot(run_dir, step, snapshot(parts), referenced)


def write_snapshot(run_dir: Path, step: int, parts: Snapshot, referenced: list[int] = ()) -> Path:
    """`save_run_state` of a `snapshot`."""
    final = run_dir / STATE_DIR / f"step-{step}"
    with atomic.replace_dir(final) as tmp:  # a step redone after a kill replaces its unreferenced earlier copy
        for name, (data, tensors) in parts.items():
            _write_part(data, tensors, tmp, name)
        (tmp / REFERENCED).write_text(json.dumps(sorted(referenced)))
        pause_for_test(run_dir, "state-write", step)
    atomic.write_json(run_dir / STATE_DIR / LATEST, {"step": step})
    return final


def paths_relative(pool: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A pool state (`ModelPool.state_dict`) whose checkpoint paths inside `run_dir` are relative to it, so a run
    directory moved or copied elsewhere resumes (`paths_under`)."""
    root = Path(run_dir).resolve()

    def relative(path: str | None) -> str | None:
        if path is None or not Path(path).resolve().is_relative_to(root):
            return path
        return str(Path(path).resolve().relative_to(root))

    return pool | {"checkpoints": [c | {"path": relative(c["path"])} for c in pool["checkpoints"]]}


def paths_under(pool: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The pool state `paths_relative` made, its relative checkpoint paths under `run_dir` (a path that names nothing
    there, written by an older version relative to its working directory, stays as it is)."""

    def under(path: str | None) -> str | None:
        if path is None or Path(path).is_absolute() or not (Path(run_dir) / path).exists():
            return path
        return str(Path(run_dir) / path)

    return pool | {"checkpoints": [c | {"path": under(c["path"])} for c in pool["checkpoints"]]}


def referenced_checkpoints(run_dir: Path) -> set[int]:
    """The checkpoint steps that the pools of the saved states play: resuming from a state loads them."""
    state_dir = run_dir / STATE_DIR
    referenced: set[int] = set()
    for k in saved_steps(state_dir, "step-"):
        path = state_dir / f"step-{k}" / REFERENCED
        if path.exists():
            referenced.update(json.loads(path.read_text()))
    return referenced


def discard_after(run_dir: Path, step: int) -> list[int]:
    """Delete the states newer than `step` and what kills left half-written or half-deleted among the states and
    checkpoints (`atomic.remove_leftovers`: a resumed run at `step` redoes what they held); returns the steps of the
    complete states deleted."""
    for directory in (run_dir / STATE_DIR, run_dir / "checkpoints"):
        atomic.remove_leftovers(directory)
    return prune(run_dir / STATE_DIR, "step-", lambda k: k <= step)


class StateWriter:
    """Writes resume states, and the checkpoint folders written off the learner's thread, on a background thread one
    at a time (a state submitted after a checkpoint is written after it), calling `after_write(step)` there after
    each state (to prune). A failed write raises at the next `submit`, `run` or `wait`, so a full disk stops the run
    loudly."""

    def __init__(self, run_dir: Path, after_write: Callable[[int], None] = lambda step: None):
        self.run_dir = run_dir
        self.after_write = after_write
        self._thread: threading.Thread | None = None
        self._error: tuple[str, BaseException] | None = None

    def submit(self, step: int, parts: Snapshot, referenced: list[int]) -> None:
        """Wait for the write in flight, then start writing `parts` (a `snapshot`) as `state/step-<step>/`."""

        def write() -> None:
            write_snapshot(self.run_dir, step, parts, referenced)
            self.after_write(step)

        self.run(write, f"the resume state under {self.run_dir / STATE_DIR}", f"state-writer-{step}")

    def run(self, write: Callable[[], None], what: str, name: str) -> None:
        """Wait for the write in flight, then start `write` (of `what`, named in its error) on thread `name`."""
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(write, what), name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until no write is in flight; raise the error of a failed one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            (what, error), self._error = self._error, None
            raise RuntimeError(f"writing {what} failed: {error}") from error

    def _write(self, write: Callable[[], None], what: str) -> None:
        try:
            write()
        except Exception as exc:  # re-raised on the learner's thread by `wait`
            self._error = (what, exc)


def latest_state(run_dir: Path) -> tuple[int, Path] | None:
    """The step and directory of the newest complete state, None when none was saved; checks every file's header
    so a corrupt state is found here, before any actor starts. A corrupt newest state (a disk that lost its last
    writes) is passed over for the newest intact one before it, with a warning naming both (the steps after it are
    then redone); with none intact, ResumeError names the newest."""
    pointer = run_dir / STATE_DIR / LATEST
    steps = saved_steps(run_dir / STATE_DIR, "step-")
    if not pointer.exists() and not steps:
        return None
    newest = None
    for step in reversed(steps):
        directory = run_dir / STATE_DIR / f"step-{step}"
        try:
            for name in PARTS:
                _check_part(directory, name)
        except ResumeError as exc:
            newest = newest or exc
            continue
        if newest is not None:
            log.warning("%s; resuming from the state of step %d instead", newest, step)
        return step, directory
    raise newest or ResumeError(f"resume pointer {pointer} names no saved state in {run_dir / STATE_DIR}")


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


def pause_for_test(run_dir: Path, point: str, step: int, before: Callable[[], None] = lambda: None) -> None:
    """The test hook of `PAUSE_ENV`: at the named point and step, call `before`, touch the marker and wait to be
    killed."""
    if os.environ.get(PAUSE_ENV) == f"{point}:{step}":
        before()
        (run_dir / PAUSE_MARKER).touch()
        while True:
            time.sleep(1.0)
