"""The demo's spread: `make demo`'s run (`unstable train examples/tictactoe-tiny.yaml`) N times, one after the other,
each a fresh run (its own warm start), as a user runs it; its win rate against random at the start and the end (the
run's own 1,000-game evaluations), the training games' win rate by opponent along the run, and its wall time; with
the demo's file as it was measured (`recipe`), which `tests/test_recipes.py` holds the file to.

    python benchmarks/demo.py --runs 5 --out benchmarks/results/demo-COMMIT/demo.json
    python benchmarks/demo.py --runs 1 --set learner.num_steps=2 ...   # any override, last (the tests' smoke)

Run it alone on the machine: the wall times are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import settings  # noqa: E402

from unstable.tracking import keys  # noqa: E402
from unstable.tracking.history import read_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "tictactoe-tiny.yaml"
CURVE_EVERY = 50  # learner steps between the points of a run's training curve


def run_demo(index: int, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh run of the demo's config (`args.set` last) in `args.work`; its figures."""
    name = f"demo-{index}"
    overrides = [f"run.dir={args.work}", f"run.name={name}", *args.set]
    command = [sys.executable, "-m", "unstable.cli.main", "train", str(DEMO), "--no-wandb"]
    start = time.perf_counter()
    subprocess.run(command + [a for o in overrides for a in ("--set", o)], check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    rows = read_rows(args.work / name)
    final = rows[-1]
    return {
        "wall_s": wall,
        "start": final["eval_start"],
        "end": final["eval_end"],
        "training_curve": training_curve(rows),
    }


def training_curve(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The training games' win rate by opponent at every `CURVE_EVERY`-th learner step (the tracker's window)."""
    curve = {}
    for row in rows:
        step, by_opponent = row.get(keys.STEP), row.get(keys.TRAIN_WDL_BY_OPPONENT)
        if step and step % CURVE_EVERY == 0 and by_opponent:
            curve[str(step)] = {name: wdl["win_rate"] for name, wdl in by_opponent.items()}
    return curve


def spread(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The end win rates' lowest, mean and highest, and the mean wall time."""
    ends = [run["end"]["win_rate"] for run in runs]
    walls = [run["wall_s"] for run in runs]
    return {"min": min(ends), "mean": statistics.fmean(ends), "max": max(ends), "wall_s_mean": statistics.fmean(walls)}


def main() -> None:
    """Parse the options, run the demo `--runs` times, write the JSON and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "demo-bench", help="the runs' directories")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, last")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "demo.json")
    args = parser.parse_args()
    runs = [run_demo(index, args) for index in range(1, args.runs + 1)]
    result = {
        "command": " ".join(sys.argv),
        "settings": settings(args),
        "recipe": yaml.safe_load(DEMO.read_text()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": runs,
        "spread": spread(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'run':<5}{'win vs random, start -> end (95% CI)':<40}{'wall s':>8}")
    for index, run in enumerate(runs, 1):
        start, end, (low, high) = run["start"]["win_rate"], run["end"]["win_rate"], run["end"]["win_ci"]
        rates = f"{start:.2f} -> {end:.2f} [{low:.2f}, {high:.2f}]"
        print(f"{index:<5}{rates:<40}{run['wall_s']:>8.0f}")
    low, mean, high = (result["spread"][k] for k in ("min", "mean", "max"))
    print(f"end win rate: min {low:.2f}, mean {mean:.3f}, max {high:.2f}")


if __name__ == "__main__":
    main()
