"""Checkpoints across nodes: a checkpoint directory read in chunks on the node whose disk holds it
(`CheckpointFiles`), and the node-local cache into which an inference server on another node copies it before
loading.

The learner writes checkpoints under the run directory, on the driver's node. An inference server on another node
cannot read that path (no shared filesystem is assumed), so it asks for the directory's files and their bytes
(actor calls on the driver's node given by its Ray shell, the bytes travelling through Ray's object store), at most
`chunk_bytes` per call, so no call holds a whole model on either node, and writes them into its own temporary
directory, once per checkpoint. The cache is bounded: beyond `capacity` checkpoints it
deletes the least recently used one (a server keeps at most `max_loras` adapters loaded; one named again is fetched
again). Its directory, `<tmp>/unstable-checkpoints/<pid>`, goes when the server stops; Ray kills a run's actors at
its end without stopping them, so each new cache first deletes those of processes no longer alive on its node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

from unstable import atomic
from unstable.records import Checkpoint
from unstable.tracking import keys

CACHE_DIR = "unstable-checkpoints"
CHUNK_BYTES = 64 << 20  # the most one call carries: a few of them in flight, never a whole model


class CheckpointFiles:
    """The checkpoint directories of this node's disk, file by file and `chunk_bytes` at a time."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes

    def files(self, path: str) -> list[tuple[str, int]]:
        """The regular files under directory `path` (recursively): each one's path relative to it and its size."""
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"checkpoint {path!r}: no such directory on the node that holds the checkpoints")
        found = sorted(p for p in root.rglob("*") if p.is_file())
        return [(p.relative_to(root).as_posix(), p.stat().st_size) for p in found]

    def read(self, path: str, name: str, offset: int) -> bytes:
        """At most `chunk_bytes` of file `name` (as `files` gives it) of directory `path`, from byte `offset`."""
        with open(_inside(Path(path), name), "rb") as file:
            file.seek(offset)
            return file.read(self.chunk_bytes)


def copy_directory(source: CheckpointFiles, path: str, destination: Path) -> int:
    """Copy checkpoint directory `path` of `source`'s node into `destination`, atomically (a reader sees all of it or
    nothing), one chunk in memory at a time; the bytes copied."""
    copied = 0
    with atomic.replace_dir(destination) as building:
        for name, size in source.files(path):
            target = _inside(building, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as file:
                while file.tell() < size:
                    chunk = source.read(path, name, file.tell())
                    if not chunk:
                        raise OSError(f"checkpoint {path!r}: {name} shrank to {file.tell()} of {size} bytes")
                    file.write(chunk)
            copied += size
    return copied


def _inside(root: Path, name: str) -> Path:
    """`root / name`, refused when `name` leads outside `root`."""
    target = (root / name).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError(f"checkpoint file {name!r} lies outside {str(root)!r}")
    return target


@dataclass
class _Entry:
    """One cached checkpoint: its local directory; the lock serialises fetching and deleting it."""

    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    evicted: bool = False


class CheckpointCache:
    """Checkpoints another node's disk holds, copied into a node-local directory on first use.

    `source` is the `CheckpointFiles` of the node that holds the checkpoints (through Ray: a proxy of an actor there).
    Thread-safe: concurrent requests for one checkpoint fetch it once. At most `capacity` checkpoints stay (least
    recently used deleted first), under `root` (by default this process's directory, `process_cache_dir()`: one cache
    per process).
    """

    def __init__(self, source: CheckpointFiles, capacity: int, root: str | Path | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._source = source
        self.capacity = capacity
        self.root = Path(root) if root is not None else process_cache_dir()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self._fetched = 0
        self._bytes = 0

    def local(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """`checkpoint` with its path in this cache, fetched if it is not there; a checkpoint without
        a path (the base model), or None, as it is."""
        if checkpoint is None or checkpoint.path is None:
            return checkpoint
        if self._closed:
            raise RuntimeError(f"checkpoint cache {self.root} is closed: {checkpoint.uid} not fetched")
        return replace(checkpoint, path=str(self._copied(checkpoint.path)))

    def stats(self, reset: bool = True) -> dict[str, int]:
        """Checkpoints fetched from the other node, and their bytes, since the last reset."""
        with self._lock:
            counts = {keys.INFERENCE_CHECKPOINTS_FETCHED: self._fetched, keys.INFERENCE_CHECKPOINT_BYTES: self._bytes}
            if reset:
                self._fetched = self._bytes = 0
            return counts

    def close(self) -> None:
        """Delete every copied checkpoint and the cache's directory; later lookups raise RuntimeError."""
        self._closed = True
        shutil.rmtree(self.root, ignore_errors=True)

    def _copied(self, source: str) -> Path:
        while True:
            entry = self._entry(source)
            with entry.lock:
                if entry.evicted:  # deleted between the lookup and the lock: look it up afresh
                    continue
                if not entry.path.is_dir():
                    copied = copy_directory(self._source, source, entry.path)
                    with self._lock:
                        self._fetched += 1
                        self._bytes += copied
            self._evict()
            return entry.path

    def _entry(self, source: str) -> _Entry:
        """The entry of `source`, made if new, marked most recently used."""
        with self._lock:
            if source not in self._entries:
                self._entries[source] = _Entry(self.root / _directory_name(source))
            self._entries.move_to_end(source)
            return self._entries[source]

    def _evict(self) -> None:
        """Delete the least recently used checkpoints beyond `capacity`."""
        while True:
            with self._lock:
                if len(self._entries) <= self.capacity:
                    return
                _, victim = self._entries.popitem(last=False)
            with victim.lock:
                victim.evicted = True
                shutil.rmtree(victim.path, ignore_errors=True)


def _directory_name(source: str) -> str:
    """A cache directory name for checkpoint path `source`: its last part, made unique by a hash of the whole."""
    digest = hashlib.blake2b(source.encode(), digest_size=8).hexdigest()
    return f"{Path(source).name}-{digest}"


def process_cache_dir() -> Path:
    """This process's cache directory, `<tmp>/unstable-checkpoints/<pid>`, made empty; first deletes the directories
    of processes that are no longer alive."""
    parent = Path(tempfile.gettempdir()) / CACHE_DIR
    parent.mkdir(exist_ok=True)
    for stale in parent.iterdir():
        if stale.name.isdigit() and not _alive(int(stale.name)):
            shutil.rmtree(stale, ignore_errors=True)
    root = parent / str(os.getpid())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return root


def _alive(pid: int) -> bool:
    """Whether process `pid` exists on this node."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
