"""What a run holds as it goes, measured from outside: the disk use of its directory, the memory of a process tree,
the size of its last metrics row. `sample(run_dir)` is the one probe of all of them; `loop.py` (peak memory),
`experiments/resume_state_cost.py` and `experiments/soak.py` use it. Not a benchmark itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def disk_bytes(path: Path) -> int:
    """Bytes of the files under `path` (what `du -b` sums, without directories); a file or folder that the run
    deletes while it is summed (retention, a state replaced) counts as gone."""
    total = 0
    for root, _, files in os.walk(path):  # os.walk skips a folder that vanishes; rglob raises
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except FileNotFoundError:
                pass
    return total


def tree_rss(process: psutil.Process | None = None) -> int:
    """Summed RSS of `process` (this one by default) and all its descendants (Ray's processes included)."""
    process = process or psutil.Process()
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def last_row_bytes(run_dir: Path) -> int:
    """Size of the last complete row of `run_dir/metrics.jsonl` (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        f.seek(max(path.stat().st_size - 1_000_000, 0))
        lines = f.read().splitlines()
    return len(lines[-1]) if lines else 0


def sample(run_dir: Path, process: psutil.Process | None = None) -> dict[str, int]:
    """Disk use of the run directory (and of its `state/` and `checkpoints/`), the RSS of `process`'s tree (this
    process by default), the last row's size and the newest tables' size (`tables.json`: what every row carried
    before issue 37)."""
    tables = run_dir / "tables.json"
    return {
        "tables_bytes": tables.stat().st_size if tables.is_file() else 0,
        "disk_bytes": disk_bytes(run_dir),
        "state_bytes": disk_bytes(run_dir / "state") if (run_dir / "state").exists() else 0,
        "checkpoint_bytes": disk_bytes(run_dir / "checkpoints") if (run_dir / "checkpoints").exists() else 0,
        "rss_bytes": tree_rss(process),
        "row_bytes": last_row_bytes(run_dir),
    }
