"""Generated tokens/s of each installed inference backend (transformers, vllm) at batch 1, 32 and 128.

Usage: `python benchmarks/inference.py [OUT_JSON] [--bandwidth-gbs 3350] [--max-new-tokens 64]`. Runs on the tiny
test model (built into `.cache/` when missing) and, when a CUDA GPU is present, also on a randomly initialised
model shaped like Qwen3-0.6B in bfloat16 (`unstable.models.ensure_shaped_model`), beside its memory-bandwidth
bound: a decode step reads every weight once, so tokens/s <= batch * bandwidth / weight bytes (KV-cache reads
ignored, so the true ceiling is lower).
Prints a table and writes JSON (default `benchmarks/results/inference.json`). Run on demand, never from tests.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import platform
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
BATCHES = (1, 32, 128)
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(ROOT / "benchmarks" / "results" / "inference.json"))
    parser.add_argument("--bandwidth-gbs", type=float, default=3350.0, help="GPU memory bandwidth (H100 SXM: 3350)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    return parser.parse_args()


def installed_backends() -> list[str]:
    """The backends this environment can run (vllm only when vLLM is installed)."""
    return ["transformers"] + (["vllm"] if importlib.util.find_spec("vllm") else [])


def build_backend(name: str, model_dir: pathlib.Path, dtype: str, max_new_tokens: int, device: str):
    """One backend serving `model_dir` with temperature-1 sampling."""
    from unstable.inference import InferenceConfig, make_backend
    from unstable.inference.transformers_backend import TransformersBackend

    cfg = InferenceConfig(
        backend=name, max_new_tokens=max_new_tokens, max_model_len=1024, max_loras=1, num_threads=None
    )
    if name == "transformers":
        return TransformersBackend(str(model_dir), cfg.sampling, dtype=dtype, device=device, max_model_len=1024)
    return make_backend(str(model_dir), cfg, dtype=dtype)


def tokens_per_second(backend, batch: int) -> tuple[int, float]:
    """Generate one batch of distinct game prompts; returns (generated tokens, seconds)."""
    from unstable.games import get_template
    from unstable.records import GenerationRequest

    template = get_template("qwen3-zs")
    requests = [
        GenerationRequest(template.render(f"Game {i}. Current Board: 0 | 1 | 2. Available Moves: '[0]', '[1]'"))
        for i in range(batch)
    ]
    start = time.perf_counter()
    results = backend.generate(requests)
    seconds = time.perf_counter() - start
    return sum(len(r.completion_token_ids) for r in results), seconds


def benchmark_model(label: str, model_dir: pathlib.Path, dtype: str, args, device: str, bound_per_seq: float | None):
    """Rows for every installed backend and batch size on one model."""
    import torch

    rows = []
    for name in installed_backends():
        backend = build_backend(name, model_dir, dtype, args.max_new_tokens, device)
        tokens_per_second(backend, 4)  # warm-up
        for batch in BATCHES:
            tokens, seconds = tokens_per_second(backend, batch)
            row = {"model": label, "backend": name, "batch": batch, "generated_tokens": tokens, "seconds": seconds}
            row["tokens_per_s"] = tokens / seconds
            if bound_per_seq is not None:
                row["bandwidth_bound_tokens_per_s"] = batch * bound_per_seq
            rows.append(row)
            print(f"  {label} {name} batch {batch}: {row['tokens_per_s']:.0f} tokens/s", flush=True)
        backend.close()
        del backend
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    """Rows as an aligned text table."""
    header = f"{'model':<18} {'backend':<13} {'batch':>5} {'tokens/s':>10} {'bound tok/s':>12} {'% bound':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        bound = row.get("bandwidth_bound_tokens_per_s")
        extra = f"{bound:>12.0f} {100 * row['tokens_per_s'] / bound:>7.1f}%" if bound else f"{'-':>12} {'-':>8}"
        print(f"{row['model']:<18} {row['backend']:<13} {row['batch']:>5} {row['tokens_per_s']:>10.0f} {extra}")


def main() -> None:
    """Benchmark, print the table, write the JSON."""
    args = parse_args()
    for key, value in VLLM_CPU_ENV.items():
        os.environ.setdefault(key, value)
    import torch

    from unstable.models import ensure_shaped_model, ensure_tiny_model, weight_bytes

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    tiny = ensure_tiny_model(CACHE / "tiny-qwen3")
    rows = benchmark_model("tiny-qwen3", tiny, "float32", args, device, None)
    if cuda:
        big = ensure_shaped_model(CACHE / "qwen3-0.6b-shape", tiny)
        bound = args.bandwidth_gbs * 1e9 / weight_bytes(big, dtype_bytes=2)
        rows += benchmark_model("qwen3-0.6b-shape", big, "bfloat16", args, device, bound)
    info = {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, {platform.machine()})",
        "max_new_tokens": args.max_new_tokens,
        "bandwidth_gbs": args.bandwidth_gbs if cuda else None,
        "rows": rows,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=2))
    print(f"\n{info['device']}, {args.max_new_tokens} new tokens per request, temperature 1")
    print_table(rows)
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
