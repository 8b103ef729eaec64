"""The embedded engine against an earlier commit's, on real game prompts: generated tokens per second of wall time
and per CPU-second, at several batch sizes.

Each tree is measured in its own process (`PYTHONPATH=<tree>/src`), one after the other, with one torch thread;
the baseline commit is checked out into a temporary git worktree. Tokens per CPU-second is the steadier figure
on a shared machine. Prompts are TicTacToe observations of random-vs-random games rendered with `qwen3-zs`
(about 215-295 tokens), batches of distinct prompts, base model, temperature 1.

    python experiments/engine_ab.py --baseline 917aa14 [--max-new-tokens 24 64] [--batches 1 16 64]
    python experiments/engine_ab.py --smoke --out /tmp/engine_ab.json   # this tree against itself (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, sys, time, torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from unstable.collector.demonstrations import generate_sft_steps
from unstable.inference import InferenceConfig, make_backend
from unstable.records import EnvSpec, GenerationRequest
model, new_tokens, batches = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
steps = generate_sft_steps(EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs"), ["random", "random"], 60,
                           AutoTokenizer.from_pretrained(model), seed=0)
rows = []
for n in new_tokens:
    backend = make_backend(model, InferenceConfig(max_new_tokens=n))
    for b in batches:
        backend.generate([GenerationRequest(s.prompt) for s in steps[:b]])  # warm-up
        rounds = max(2, 64 // b)
        cpu, wall, tokens = time.process_time(), time.perf_counter(), 0
        for i in range(rounds):
            batch = steps[(i * b) % (len(steps) - b):][:b]
            results = backend.generate([GenerationRequest(s.prompt) for s in batch])
            tokens += sum(len(r.completion_token_ids) for r in results)
        rows.append({"max_new_tokens": n, "batch": b, "tokens": tokens,
                     "tokens_per_s": tokens / (time.perf_counter() - wall),
                     "tokens_per_cpu_s": tokens / (time.process_time() - cpu)})
print(json.dumps(rows))
"""


def measure(src: Path, model: str, args) -> list[dict]:
    """Run MEASURE with `src` first on the path; its rows."""
    env = os.environ | {"PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-c", MEASURE, model, json.dumps(args.max_new_tokens), json.dumps(args.batches)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_commit(commit: str, model: str, args) -> list[dict]:
    """MEASURE on `commit`'s tree, checked out into a temporary git worktree (removed after)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "-q", tmp, commit], check=True)
        try:
            return measure(Path(tmp) / "src", model, args)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a commit to compare this tree with")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[24, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", default="experiments/results/engine_ab.json")
    parser.add_argument(
        "--smoke", action="store_true", help="this tree against itself (no worktree), 2 tokens, batch 1"
    )
    args = parser.parse_args()
    if not args.smoke and not args.baseline:
        parser.error("--baseline COMMIT is required (or --smoke)")
    if args.smoke:
        args.baseline, args.max_new_tokens, args.batches = "this tree", [2], [64]  # 64: the fewest rounds (2)

    from unstable.models.tiny import ensure_tiny_model

    model = str(ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3"))
    baseline = measure(ROOT / "src", model, args) if args.smoke else measure_commit(args.baseline, model, args)
    current = measure(ROOT / "src", model, args)
    result = {"baseline": args.baseline, "cpus": os.cpu_count(), "baseline_rows": baseline, "rows": current}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{'new tokens':>10} {'batch':>6} {'tok/s before':>13} {'tok/s now':>10} {'tok/cpu-s before':>17} {'now':>7}")
    for old, new in zip(baseline, current):
        print(
            f"{new['max_new_tokens']:>10} {new['batch']:>6} {old['tokens_per_s']:>13.0f} {new['tokens_per_s']:>10.0f} "
            f"{old['tokens_per_cpu_s']:>17.0f} {new['tokens_per_cpu_s']:>7.0f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
