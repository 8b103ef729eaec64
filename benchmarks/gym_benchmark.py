"""Shared runner of the gymnasium benchmarks (`cartpole.py`, `pendulum.py`): train `unstable.rl.gym_utils`'s
agent with `train_gym` over several seeds, read each run's evaluation curve back from its `eval_stats.jsonl`,
write a JSON of the results and print a table."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from unstable.rl.gym_utils import EVAL_MEAN_RETURN, GymConfig, train_gym
from unstable.rl.trainer import ENV_STEPS, EVAL_STATS_FILE

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def make_parser(description: str, default_seeds: int) -> argparse.ArgumentParser:
    """`--seeds N`, `--out FILE` (defaults: `default_seeds`, benchmarks/results/<script>.json) and `--smoke`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", type=int, default=default_seeds, help="independent runs (seeds 0..N-1)")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="1 seed, 2 train steps, each evaluated on 2 episodes")
    return parser


def smoke_config(cfg: GymConfig) -> GymConfig:
    """`cfg` cut to two train steps (one collection each), each followed by a 2-episode evaluation (tests)."""
    return cfg.replace(
        total_env_steps=2 * cfg.num_envs * cfg.steps_per_collect, eval_interval=1, eval_episodes=2, stop_at_return=None
    )


def run_seed(cfg: GymConfig) -> dict[str, Any]:
    """Train one seed; its wall time, training env steps and evaluation curve."""
    start = time.perf_counter()
    train_gym(cfg)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (cfg.run_dir / EVAL_STATS_FILE).read_text().splitlines()]
    curve = [(int(row[ENV_STEPS]), row[EVAL_MEAN_RETURN]) for row in rows]
    return {"seed": cfg.seed, "wall_seconds": round(seconds, 1), "env_steps": curve[-1][0], "curve": curve}


def run_benchmark(name: str, cfg: GymConfig, seeds: int, out: Path | None, summary: dict[str, Any]) -> dict:
    """Run `seeds` seeds of `cfg` on one torch thread, write `<name>.json` and print a table."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as log_dir:
        runs = [run_seed(cfg.replace(seed=seed, log_dir=log_dir, run_name=f"seed_{seed}")) for seed in range(seeds)]
    result = {
        "benchmark": name,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch threads 1",
        "config": cfg.to_dict(),
        "runs": runs,
    } | summary_of(runs, summary)
    out = out or RESULTS_DIR / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'seed':>4} {'env steps':>10} {'wall s':>8} {'first return':>13} {'last return':>12} {'best return':>12}")
    for run in runs:
        returns = [r for _, r in run["curve"]]
        print(
            f"{run['seed']:>4} {run['env_steps']:>10} {run['wall_seconds']:>8} {returns[0]:>13.1f} "
            f"{returns[-1]:>12.1f} {max(returns):>12.1f}"
        )
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "runs")}, indent=1))
    print(f"wrote {out}")
    return result


def summary_of(runs: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """Means over seeds, merged with the caller's own summary fields."""
    n = len(runs)
    return summary | {
        "seeds": n,
        "mean_env_steps": round(sum(r["env_steps"] for r in runs) / n),
        "mean_wall_seconds": round(sum(r["wall_seconds"] for r in runs) / n, 1),
        "mean_first_return": round(sum(r["curve"][0][1] for r in runs) / n, 1),
        "mean_last_return": round(sum(r["curve"][-1][1] for r in runs) / n, 1),
    }
