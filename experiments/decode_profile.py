"""Where the embedded engine's decode step spends its time: `DecodeBatch.step` beside a bare transformers decode loop
on the same model and prompts, and torch.profiler's top operators of the step.

    python experiments/decode_profile.py [--model DIR] [--batches 1 128] [--steps 16] [--out FILE.json]
    python experiments/decode_profile.py --engine-only [--cudnn-attention]   # the engine alone, on fresh shapes

Without `--model`: on a CUDA GPU the random-weight Qwen3-0.6B-shaped model (`.cache/qwen3-0.6b-shape`, built when
missing), else the tiny test model. Three timings per batch, each over `--steps` decode steps after 4 warm-up ones:
- `bare`: `model(input_ids=next, past_key_values=cache)` alone, no attention mask (what transformers does with one
  unpadded batch);
- `bare_masked`: the same with the attention mask and position ids `DecodeBatch` passes (rows left-padded);
- `engine`: `DecodeBatch.step` (the forward above plus sampling and the rows' bookkeeping).
The gap between `bare` and the bound shows transformers' own per-step cost; between `bare` and `engine`, ours.
`--engine-only` times the engine first, on sequence lengths the process has not met (cuDNN's attention builds a plan
per new shape); `--cudnn-attention` lets the engine use cuDNN's attention, as it did before `ATTENTION_BACKENDS`.
Results of the H100 runs: `experiments/results/decode-attention/`, experiments/log.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from unstable.inference import decoding

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu as gpu_bench  # noqa: E402 - benchmarks/gpu.py: the engine's running batch, as its decode rows time it
import inference as inference_bench  # noqa: E402 - benchmarks/inference.py builds the backend as gpu.py does
import loop as loop_bench  # noqa: E402 - benchmarks/loop.py: the loop's real prompts

WARMUP = 4


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: see the module docstring)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", help="write the timings here as JSON")
    parser.add_argument("--engine-only", action="store_true", help="time only the engine's step, on fresh shapes")
    parser.add_argument("--cudnn-attention", action="store_true", help="let the engine's SDPA use cuDNN's kernels")
    return parser.parse_args()


def model_directory(args, cuda: bool) -> Path:
    """`--model`, else the 0.6B-shape model on a GPU or the tiny one on the CPU (built into `.cache/`)."""
    from unstable.models import ensure_shaped_model, ensure_tiny_model

    if args.model:
        return Path(args.model).resolve()
    tiny = ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3")
    return ensure_shaped_model(ROOT / ".cache" / "qwen3-0.6b-shape", tiny) if cuda else tiny


def timed_steps(step, steps: int, device: str) -> float:
    """Seconds per call of `step` over `steps` calls after `WARMUP` untimed ones."""
    for _ in range(WARMUP):
        step()
    gpu_bench.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    gpu_bench.synchronize(device)
    return (time.perf_counter() - start) / steps


def bare_step_fn(model, prompts: list[list[int]], pad_id: int, device: str, masked: bool):
    """A transformers-only decode step over left-padded `prompts` (with or without the mask and positions)."""
    from transformers import DynamicCache

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    kwargs = {"attention_mask": mask, "position_ids": positions} if masked else {}
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **kwargs)
    state = {"next": out.logits[:, -1].argmax(-1, keepdim=True), "mask": mask, "pos": positions[:, -1:] + 1}

    @torch.no_grad()
    def step():
        extra = {}
        if masked:
            state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], 1)
            extra = {"attention_mask": state["mask"], "position_ids": state["pos"]}
            state["pos"] = state["pos"] + 1
        out = model(input_ids=state["next"], past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
        state["next"] = out.logits[:, -1].argmax(-1, keepdim=True)

    return step


def profile_table(step, device: str, rows: int = 18) -> str:
    """torch.profiler's operators of 3 calls of `step`, by self CPU time and (on a GPU) by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        gpu_bench.synchronize(device)
    averages = prof.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48)
    if device == "cuda":
        table += "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=48)
    return table


def main() -> None:
    """Time the three decode steps per batch size, print the profile of the engine's step, write the JSON."""
    args = parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if args.cudnn_attention:  # as the engine was before it left cuDNN out (decoding.ATTENTION_BACKENDS)
        decoding.ATTENTION_BACKENDS = [*decoding.ATTENTION_BACKENDS, SDPBackend.CUDNN_ATTENTION]
    model_dir = model_directory(args, cuda)
    dtype = "bfloat16" if cuda else "float32"
    backend = inference_bench.build_backend("transformers", model_dir, dtype, 1, device)
    texts = loop_bench.game_prompts(backend.tokenizer, max(args.batches))
    prompts = [backend.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    pad_id = backend.tokenizer.pad_token_id
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "model": model_dir.name, "rows": []}
    result["cudnn_attention"] = args.cudnn_attention
    room = 2 * (WARMUP + args.steps) + 4  # new tokens no row reaches while timed or profiled
    for batch in args.batches:
        rows = prompts[:batch]
        row = {"batch": batch}
        for name, masked in () if args.engine_only else (("bare", False), ("bare_masked", True)):
            row[f"{name}_ms"] = 1e3 * timed_steps(
                bare_step_fn(backend.model, rows, pad_id, device, masked), args.steps, device
            )
        engine = gpu_bench.running_batch(backend, rows, room)
        row["engine_ms"] = 1e3 * timed_steps(engine.step, args.steps, device)
        row["engine_tokens_per_s"] = 1e3 * batch / row["engine_ms"]
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        if not args.engine_only:
            print(
                f"--- engine step, batch {batch}:\n"
                + profile_table(gpu_bench.running_batch(backend, rows, room).step, device)
            )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
