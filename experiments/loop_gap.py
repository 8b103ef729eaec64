"""How much of the whole loop's gap to the bare engine on one GPU is the learner's share of that GPU: the bare engine's
generated tokens/s alone, then beside a learner that trains without pause in another process on the same GPU, then
alone again (so drift shows), at the loop's concurrency and on the loop's prompts, as `benchmarks/gpu.py` measures
its `bare` part.

    python experiments/loop_gap.py [--out FILE.json] [--rounds 8]
    python experiments/loop_gap.py --smoke --out /tmp/gap.json    # the same code on the CPU, tiny model and sizes

The model and settings are `benchmarks/gpu.py`'s (the Qwen3-0.6B-shaped random-weight model in bf16,
`examples/single-gpu.yaml` with the transformers engine, 128 games in flight; the learner is its LoRA r32 learner on
64 x 1,024-token steps). In the loop the learner is busy only part of the time (`loop.learner_wait_share`), so the
middle row is the most that sharing the GPU can cost. Result of the H100 run: experiments/log.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu as gpu_bench  # noqa: E402 - benchmarks/gpu.py: its model, settings, learner steps and device name
import loop as loop_bench  # noqa: E402 - benchmarks/loop.py: the loop's prompts and the bare engine's timing

from unstable import atomic  # noqa: E402


def parse_args() -> argparse.Namespace:
    """The command line; `--model` and `--smoke` as gpu.py reads them, and the `run_dir` its `run_config` names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results" / "loop_gap.json"))
    parser.add_argument("--smoke", action="store_true", help="run on the CPU with the tiny model and tiny sizes")
    parser.add_argument("--model", help="model directory (default: gpu.py's)")
    parser.add_argument("--rounds", type=int, default=8, help="timed batches of the loop's concurrency per row")
    args = parser.parse_args()
    args.run_dir = "runs"  # no run is started: gpu.run_config only names it
    return args


def train_without_pause(args: argparse.Namespace, ready, stop, updates) -> None:
    """In a child process: gpu.py's LoRA learner, one warm-up update, then `ready`, then updates until `stop`."""
    sizes = gpu_bench.SMOKE if args.smoke else gpu_bench.FULL
    model_dir = gpu_bench.model_directory(args)
    learner = gpu_bench.example_learner(gpu_bench.run_config(model_dir, sizes, args), model_dir, lora=True)
    steps = gpu_bench.synthetic_steps(gpu_bench.model_shape(model_dir).vocab, sizes)
    learner.train_step(steps)
    ready.set()
    while not stop.is_set():
        learner.train_step(steps)
        with updates.get_lock():
            updates.value += 1


def bare_row(backend, prompts: list[str], workers: int, label: str) -> dict:
    """One timing of the bare engine on the base model, printed."""
    row = loop_bench.measure_bare(backend, prompts, workers) | {"condition": label}
    print(f"  {label:<16} {row['tokens_per_s']:>9,.0f} tokens/s", flush=True)
    return row


def beside_learner(args, backend, prompts: list[str], workers: int) -> dict:
    """The bare engine timed while a learner process trains on the same device; its updates per second with it."""
    context = mp.get_context("spawn")
    ready, stop, updates = context.Event(), context.Event(), context.Value("i", 0)
    learner = context.Process(target=train_without_pause, args=(args, ready, stop, updates), daemon=True)
    learner.start()
    try:
        if not ready.wait(timeout=600):
            sys.exit("the learner process did not finish its warm-up update in 600 s")
        start, before = time.perf_counter(), updates.value
        row = bare_row(backend, prompts, workers, "beside learner")
        row["learner_updates_per_s"] = (updates.value - before) / (time.perf_counter() - start)
    finally:
        stop.set()
        learner.join(timeout=300)
    return row


def main() -> None:
    """Alone, beside the learner, alone again: one JSON and a printed table."""
    from unstable.inference import make_backend

    args = parse_args()
    cuda = not args.smoke and torch.cuda.is_available()
    if not args.smoke and not cuda:
        sys.exit("loop_gap.py measures a CUDA GPU; on a CPU run it with --smoke")
    sizes = gpu_bench.SMOKE if args.smoke else gpu_bench.FULL
    model_dir = gpu_bench.model_directory(args)
    cfg = gpu_bench.run_config(model_dir, sizes, args)
    backend = make_backend(str(model_dir), cfg.inference, dtype=cfg.model.dtype, seed=cfg.run.seed)
    workers = cfg.collector.num_workers
    try:
        prompts = loop_bench.game_prompts(backend.tokenizer, (args.rounds + 1) * workers, openings_only=True)
        rows = [
            bare_row(backend, prompts, workers, "alone"),
            beside_learner(args, backend, prompts, workers),
            bare_row(backend, prompts, workers, "alone again"),
        ]
    finally:
        backend.close()
    alone = (rows[0]["tokens_per_s"] + rows[2]["tokens_per_s"]) / 2
    result = {
        "device": gpu_bench.device_description(cuda),
        "smoke": args.smoke,
        "workers": workers,
        "rounds": args.rounds,
        "rows": rows,
        "beside_learner_over_alone": rows[1]["tokens_per_s"] / alone,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps(result, indent=2))
    print(f"\n{result['device']}: beside a learner the bare engine keeps {result['beside_learner_over_alone']:.2f}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
