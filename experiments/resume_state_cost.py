"""What the resume state costs per learner step: its share of the learner's step time, and the disk, memory and
metrics-row size a run holds as it goes, for each way of saving it (the decision of issue 37; quickstart.md cites it):

    PYTHONPATH=src .venv/bin/python experiments/resume_state_cost.py [--steps 50] \
        [--out experiments/results/resume_state_cost.json]

The learner loop runs in-process on the tiny model (no Ray, no games: the step buffer gets made-up games of 4
moves, the pool one rated game per step, so its ladder and match matrix grow as in a run), for each of LoRA and
full fine-tuning and each way of saving the resume state:

- `default`: `learner.resume_state` as shipped (every 10 steps or 10 minutes, the newest 2 kept);
- `last-only`: no interval, the state saved at the last step only (saves "disabled");
- `every-step-keep-all`: a state per step and every state kept, as before issue 37.

It prints a table (median learner step time and its increase over `last-only`; the seconds spent on the state on
the learner's path, in all and as a share of `last-only`'s step time; the run directory's disk use; the metrics
row size at the first and last step) and writes the JSON (each mode runs `--repeats` times, alternating, and the
run with the lowest median counts: the machine is shared, and a busy spell inflates the wall-clock comparison;
the seconds on the learner's path are the direct measure of what the state costs the learner). The probes are
`benchmarks/footprint.py`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from footprint import sample  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODES = {
    "default": {},
    "last-only": {"every_steps": None, "every_minutes": None},
    "every-step-keep-all": {"every_steps": 1, "keep_last": 10**9},
}


def _game(seed: int, players: dict[int, str]):
    from unstable.records import GameRecord, Step

    steps = tuple(
        Step("TicTacToe-v0-train", turn % 2, turn, "o", "[1]", prompt_token_ids=tuple(range(5, 45)),
             completion_token_ids=(8 + turn, 9, 10, 11), behaviour_logprobs=(-1.0,) * 4)
        for turn in range(4)
    )  # fmt: skip
    rewards = {0: 1.0, 1: -1.0} if seed % 2 else {0: -1.0, 1: 1.0}
    return GameRecord("TicTacToe-v0-train", seed, players, steps, rewards, learner_player_ids=(0,))


def run_mode(model_dir: str, run_dir: Path, steps: int, lora: bool, resume_state: dict[str, Any]) -> dict[str, Any]:
    """`steps` learner steps of the loop with `resume_state` settings; step times and samples."""
    from unstable.algorithms import Reinforce
    from unstable.buffer import StepBuffer
    from unstable.buffer.config import BufferConfig
    from unstable.learner import Learner, LearnerConfig, LoraConfig
    from unstable.pool import ModelPool
    from unstable.runtime.loop import LearnerLoop
    from unstable.tracking import Tracker, TrackerConfig, keys

    cfg = LearnerConfig(
        num_steps=steps, batch_size=8, optimizer={"learning_rate": 1e-4}, resume_state=resume_state,
        policy={"micro_batch_tokens": 1024, "lora": LoraConfig(lora_rank=8) if lora else None},
    )  # fmt: skip
    buffer = StepBuffer(BufferConfig(max_buffer_size=steps * 8 + 8))
    for seed in range(4 * steps + 1):  # 2 learner moves a game, 8 a batch
        buffer.add_game(_game(seed, {0: "ckpt-0", 1: "random"}))
    pool = ModelPool()
    pool.add_checkpoint(None, iteration=-1)
    tracker = Tracker(run_dir, cfg=TrackerConfig(tensorboard=False, wandb="disabled"))
    tracker.add_source(pool)
    loop = LearnerLoop(Learner.build(model_dir, Reinforce(), cfg), buffer, pool, tracker, str(run_dir))
    loop.initialize()
    first = sample(run_dir)
    times, on_path = [], 0.0
    for seed in range(steps):
        start = time.perf_counter()
        row = loop.train(1)[0]
        times.append(time.perf_counter() - start)
        on_path += row[keys.STATE_SAVE_SECONDS]
        pool.record_game(_game(seed, {0: pool.latest().uid, 1: "random"}))
        if seed == 0:
            first = sample(run_dir)
    start = time.perf_counter()
    loop.close()
    on_path += time.perf_counter() - start  # the last state's snapshot and the wait for its write
    return {
        "step_seconds": times,
        "mean_step_seconds": statistics.fmean(times[2:]),
        "median_step_seconds": statistics.median(times[2:]),
        "state_seconds_on_path": on_path,
        "first": first,
        "last": sample(run_dir),
        "states_kept": len(list((run_dir / "state").glob("step-*"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating; the fastest counts")
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results" / "resume_state_cost.json"))
    args = parser.parse_args()
    import torch

    from unstable.models.tiny import ensure_tiny_model

    torch.set_num_threads(1)
    model_dir = str(ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3"))
    results: dict[str, Any] = {"steps": args.steps, "model": str(Path(model_dir).relative_to(ROOT))}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # alternating modes, so a busy spell of the shared machine hits each
            for lora in (True, False):
                for mode, settings in MODES.items():
                    name = f"{'lora' if lora else 'full'}/{mode}"
                    run = run_mode(model_dir, Path(tmp) / f"{name}-{repeat}", args.steps, lora, settings)
                    print(f"{name} ({repeat + 1}/{args.repeats}): {run['median_step_seconds']:.4f} s/step", flush=True)
                    if name not in results or run["median_step_seconds"] < results[name]["median_step_seconds"]:
                        results[name] = run
    print_table(results)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


def print_table(results: dict[str, Any]) -> None:
    """Median step time against `last-only`; the state's seconds on the learner's path over the run, and as a share
    of `last-only`'s step time; disk and row size."""
    print(
        f"{'run':28} {'s/step':>8} {'vs last-only':>12} {'state s on path':>15} {'share':>6} {'states':>6} "
        f"{'disk MB':>8} {'state MB':>8} {'row B first':>11} {'row B last':>10} {'tables B last':>13}"
    )
    for kind in ("lora", "full"):
        base = results[f"{kind}/last-only"]["median_step_seconds"]
        for mode in MODES:
            r = results[f"{kind}/{mode}"]
            share = r["state_seconds_on_path"] / (results["steps"] * base)
            print(
                f"{kind + '/' + mode:28} {r['median_step_seconds']:8.4f} {r['median_step_seconds'] / base - 1:+12.1%} "
                f"{r['state_seconds_on_path']:15.3f} {share:6.1%} {r['states_kept']:6d} "
                f"{r['last']['disk_bytes'] / 1e6:8.2f} {r['last']['state_bytes'] / 1e6:8.2f} "
                f"{r['first']['row_bytes']:11d} {r['last']['row_bytes']:10d} "
                f"{r['last']['tables_bytes']:13d}"
            )


if __name__ == "__main__":
    main()
