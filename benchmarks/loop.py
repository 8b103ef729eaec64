"""End-to-end loop throughput: the whole Ray run (collector + inference + learner) against the bare backend.

Runs `unstable.runtime.train` on the tiny model for a few learner steps and reports finished games/s,
generated tokens/s, learner seconds/step and peak memory of the whole process tree; then times the bare
inference backend alone at the same batch size, so the loop's overhead is visible (the peer note in
`shared/notes/ub-peer-cpu.md` measured UnstableBaselines at 178 tok/s vs 1,797 for a bare vLLM engine).

    python benchmarks/loop.py [--backend transformers|vllm] [--steps 6] [--workers 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import psutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parent.parent


class PeakMemory:
    """Samples the summed RSS of this process and all its descendants (Ray's processes included)."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self.interval_s)


def run_loop(args) -> dict:
    """The whole loop on Ray; throughput from the tracker rows after the first (warm-up) step."""
    from unstable.config import load_config
    from unstable.runtime import train

    overrides = [
        f"learner.num_steps={args.steps}",
        f"collector.num_workers={args.workers}",
        "collector.num_eval_workers=0",
        "evaluation.games_at_start=0",
        "evaluation.games_at_end=0",
        f"inference.backend={args.backend}",
        f"inference.max_new_tokens={args.max_new_tokens}",
        f"learner.batch_size={args.batch_size}",
        "run.name=bench-loop",
        f"run.dir={args.run_dir}",
    ]
    cfg = load_config(ROOT / "examples" / "tictactoe-tiny.yaml", overrides)
    rows = []
    start = time.perf_counter()
    with PeakMemory() as memory:
        train(cfg, on_row=rows.append)
    steady = [r for r in rows if r.get("learner/step", 0) >= 2]
    return {
        "wall_s": time.perf_counter() - start,
        "games_per_s": statistics.mean(r["collector/games_per_s"] for r in steady),
        "tokens_per_s": statistics.mean(r["inference/tokens_per_s"] for r in steady),
        "learner_s_per_step": statistics.mean(r["learner/update_seconds"] for r in steady),
        "peak_rss_gb": memory.peak_bytes / 1e9,
    }


def run_bare(args, batch: int) -> dict:
    """The bare backend: repeated batches of `batch` TicTacToe prompts, no Ray, no games."""
    from unstable.games import get_template
    from unstable.inference import InferenceConfig, make_backend
    from unstable.models.tiny import ensure_tiny_model
    from unstable.records import GenerationRequest

    model = str(ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3"))
    backend = make_backend(model, InferenceConfig(backend=args.backend, max_new_tokens=args.max_new_tokens))
    prompt = get_template("qwen3-zs").render("Current Board:\n 0 | 1 | 2 \nAvailable Moves: '[0]', '[1]', '[2]'")
    requests = [GenerationRequest(prompt)] * batch
    backend.generate(requests)  # warm-up
    tokens, start = 0, time.perf_counter()
    for _ in range(args.bare_rounds):
        tokens += sum(len(r.completion_token_ids) for r in backend.generate(requests))
    elapsed = time.perf_counter() - start
    backend.close()
    return {"batch": batch, "tokens_per_s": tokens / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--bare-rounds", type=int, default=5)
    parser.add_argument("--run-dir", default="runs")
    parser.add_argument("--out", default="benchmarks/results/loop.json")
    args = parser.parse_args()

    loop = run_loop(args)
    bare = run_bare(args, batch=args.workers)  # the engine alone with as many requests as the loop has games
    result = {
        "backend": args.backend,
        "settings": vars(args),
        "loop": loop,
        "bare": bare,
        "loop_over_bare": loop["tokens_per_s"] / bare["tokens_per_s"],
        "cpus": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{'measure':<28}{'value':>12}")
    for key, value in [
        ("loop games/s", loop["games_per_s"]),
        ("loop generated tok/s", loop["tokens_per_s"]),
        ("learner s/step", loop["learner_s_per_step"]),
        ("peak RSS GB (all procs)", loop["peak_rss_gb"]),
        (f"bare backend tok/s @ {bare['batch']}", bare["tokens_per_s"]),
        ("loop / bare", result["loop_over_bare"]),
    ]:
        print(f"{key:<28}{value:>12.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
