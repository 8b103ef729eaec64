"""The one atomic writer: every checkpoint, state, pointer and rewritten file goes to a temporary name beside its
final one and is renamed into place, so a reader (or a resumed run after a kill) sees the old version or the new
one, never half of one. Files are flushed to disk before the rename; a temporary name ends in `.tmp`, which is
how resume recognises (and deletes) what a kill left half-written.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def temporary_name(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: `path` plus `.tmp`."""
    return path.with_name(path.name + ".tmp")


@contextmanager
def replace_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open `path.tmp` for writing; when the block ends without an exception, flush it to disk and rename it over
    `path`. On an exception the temporary file is removed and `path` keeps what it held."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` atomically (`replace_file`)."""
    with replace_file(path) as f:
        f.write(text)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Replace `path` with `data` as JSON atomically (`replace_file`)."""
    with replace_file(path) as f:
        json.dump(data, f)


@contextmanager
def replace_dir(path: str | os.PathLike, building: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield an empty directory to fill (`building`, or `path.tmp` made afresh); when the block ends without an
    exception, rename it to `path`, replacing any earlier `path` (moved aside first, so `path` is never missing
    its files). On an exception the directory being built is removed and `path` keeps what it held."""
    path = Path(path)
    tmp = Path(building) if building is not None else temporary_name(path)
    if building is None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        yield tmp
        _flush_tree(tmp)
        _move_into_place(tmp, path)
        _flush(path.parent)  # the rename itself
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _flush_tree(directory: Path) -> None:
    """Flush every file under `directory`, and the directories holding them, to disk."""
    for folder, _, files in os.walk(directory):
        for name in files:
            _flush(Path(folder) / name)
        _flush(Path(folder))


def _flush(path: Path) -> None:
    """fsync one file or directory (its data, or its entries)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _move_into_place(built: Path, path: Path) -> None:
    """Rename the finished directory `built` to `path`; an existing `path` is moved into a hidden sibling first
    and deleted after, so a reader never finds `path` half-deleted."""
    if not path.exists():
        os.replace(built, path)
        return
    stale = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, stale / path.name)
    os.replace(built, path)
    shutil.rmtree(stale)


def remove_leftovers(directory: str | os.PathLike) -> list[str]:
    """Delete what kills left in `directory` between the steps above: temporary `*.tmp` entries and the hidden
    `.<name>.old-*` directories `replace_dir` moves an old version into before deleting it. Only for a directory
    no one writes into now (a run being resumed); returns the names deleted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    deleted = []
    for entry in directory.iterdir():
        if entry.name.endswith(".tmp") or (entry.name.startswith(".") and ".old-" in entry.name):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            deleted.append(entry.name)
    return deleted
