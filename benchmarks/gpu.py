"""Every GPU row of docs/hardware.md in one command: the embedded engine's decode against the weight-bandwidth
bound, learner MFU with LoRA and with full fine-tuning, and the whole loop against the bare engine, on one GPU.

    python benchmarks/gpu.py [--out benchmarks/results/gpu.json] [--bandwidth-gbs B] [--peak-tflops F]
    python benchmarks/gpu.py --smoke --out /tmp/gpu.json   # the same code on CPU, tiny model and sizes (tests)
    python benchmarks/gpu.py --parts loop --compile off      # some parts only (the loop includes the bare engine)

The model is a random-weight bfloat16 model shaped like Qwen3-0.6B (`unstable.models.ensure_shaped_model`, built
once into `.cache/` with the tiny model's tokenizer: nothing comes from a model hub). The settings are
`examples/single-gpu.yaml`'s with the transformers engine (vLLM is not on the lent machine). Each part prints its
time; on one H100 they add up to under 8 minutes (plus building the model, once). The JSON's top-level fractions:

- `decode_fraction_of_bound_b{1,32,128}`: tokens/s of the embedded engine's decode step (`DecodeBatch.step`,
  base model, temperature 1, no row stopping) on B real TicTacToe prompts, over `Sizes.decode_steps` steps
  after `Sizes.decode_warmup` (prefill excluded), divided by the bound B x bandwidth / weight bytes: a decode step reads
  every weight once (the tied embedding once, as the output layer). KV-cache reads are left out of the bound,
  so the true ceiling is lower; each row's `kv_bytes_per_step` and fraction of the bound with them are in `decode`.
- `learner_mfu_lora`, `learner_mfu_full`: model FLOPs per second of `Learner.train_step` (the example's Reinforce
  with LoRA r32, and with `lora: null`), over the peak dense bf16 FLOPs. An update is 64 steps of 256 prompt +
  768 completion tokens (random ids), timed over `Sizes.learner_updates` updates after one warm-up. With N decoder-layer
  weights, N_a adapter weights, L layers of attention width d (query heads x head_dim), an output layer V x H,
  and per sequence T tokens of which C are completion targets, an update's FLOPs are
      full fine-tuning: 6 N sum(T) + 6 V H sum(C) + 6 L d sum(T^2)
      LoRA:             4 N sum(T) + 6 N_a sum(T) + 4 V H sum(C) + 6 L d sum(T^2)
  (2 per weight and token forward; backward 4 for a trained weight, 2 for a frozen one the gradient only passes
  through; the output layer runs on completion targets only; causal attention is QK^T and AV over half of each
  T x T, 2 L d T^2 forward, 3x that with backward; embedding lookups cost none). Gradient checkpointing's second
  forward is not counted (model FLOPs, not hardware FLOPs).
- `loop_over_bare`: generated tokens/s of the whole loop (`unstable train` on Ray, engine and learner sharing the
  GPU 0.5 + 0.5 as in the example, mirror self-play, counted after learner step 1 and a pause of the engine right
  after it, if any, as a compiled engine's at the first adapter: `loop.measure_loop`) over the
  bare engine's at the same concurrency (the collector's games in flight) on the prompts the loop serves (a
  random-weight model's games never pass the opening prompt: `loop.game_prompts`), serving the run's last LoRA
  adapter as the loop does (`loop.measure_bare`; the base model's figure is in `bare` too).

Bandwidth and peak come from the device name (`DEVICE_PEAKS`, datasheet figures) or `--bandwidth-gbs` and
`--peak-tflops`; an unknown GPU needs both. `--smoke` runs on the CPU with nominal values (`CPU_NOMINAL`, flagged
`nominal_peaks`): its fractions only show that the code runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import loop as loop_bench  # benchmarks/loop.py: the whole loop and the bare engine, measured
import torch

from unstable import atomic

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
DEVICE_PEAKS = (  # (name contains, memory bandwidth GB/s, dense bf16 TFLOPS); the first match wins
    ("h200 nvl", 4800.0, 835.0),
    ("h200", 4800.0, 989.0),
    ("h100 pcie", 2000.0, 756.0),
    ("h100 nvl", 3900.0, 835.0),
    ("h100", 3350.0, 989.0),  # SXM5, HBM3 ("NVIDIA H100 80GB HBM3")
)
CPU_NOMINAL = (100.0, 1.0)  # GB/s, TFLOPS: round figures for a server CPU, so that smoke fractions are defined
PARTS = ("decode", "learner", "sync", "loop", "variants", "profile")
PROFILED_BATCHES = (1, 128)  # decode batch sizes whose steps torch.profiler breaks down


@dataclass(frozen=True)
class Sizes:
    """How much each part runs."""

    decode_batches: tuple[int, ...] = (1, 32, 128)
    decode_warmup: int = 4
    decode_steps: int = 32
    learner_steps: int = 64  # per update
    prompt_tokens: int = 256
    completion_tokens: int = 768
    learner_updates: int = 3
    loop_steps: int = 8  # learner steps of the whole loop; the first is its warm-up
    loop_new_tokens: int = 64
    loop_workers: int | None = None  # games in flight; None: the example's
    bare_rounds: int = 4


FULL = Sizes()
SMOKE = replace(
    FULL,
    decode_warmup=1,
    decode_steps=4,
    learner_steps=4,
    prompt_tokens=24,
    completion_tokens=8,
    learner_updates=1,
    loop_steps=3,
    loop_new_tokens=8,
    loop_workers=4,
    bare_rounds=8,
)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP and byte counts need from a model's config."""

    layer_weights: int  # N: every weight of the decoder layers (attention, MLP, norms)
    vocab: int
    hidden: int
    layers: int
    attention_width: int  # query heads x head_dim
    kv_width: int  # key-value heads x head_dim


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="run on the CPU with the tiny model and tiny sizes")
    parser.add_argument("--model", help="model directory (default: the 0.6B-shape model, or the tiny one to smoke)")
    parser.add_argument("--bandwidth-gbs", type=float, help="GPU memory bandwidth (default: from the device name)")
    parser.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOPS (default: from the device name)")
    parser.add_argument("--run-dir", default="runs", help="where the loop's run directory goes")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="the parts to run (default: all; the loop includes the bare engine), for a short time on a GPU",
    )
    parser.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="the engine's `inference.compile`; auto: time decode both ways (on a GPU) and run the rest the faster way",
    )
    return parser.parse_args()


def device_description(cuda: bool) -> str:
    """The device, its memory and the torch build."""
    if cuda:
        props = torch.cuda.get_device_properties(0)
        memory = f"{props.total_memory / 2**30:.0f} GiB"
        return f"{props.name}, {memory}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"cpu ({os.cpu_count()} cores, {platform.machine()}), torch {torch.__version__}"


def commit() -> str | None:
    """The checkout's commit (None where there is no git, as on a machine sent only the files)."""
    import subprocess

    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
            ).stdout.strip()
            or None
        )
    except OSError:
        return None


def package_versions() -> dict[str, str]:
    """The versions of the packages the measurements depend on."""
    import importlib.metadata

    names = ("torch", "transformers", "peft", "triton", "ray")
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_peaks(cuda: bool, args) -> tuple[float, float, bool]:
    """(bandwidth GB/s, peak TFLOPS, whether either is a nominal CPU value): the overrides, else the device's."""
    if cuda:
        name = torch.cuda.get_device_name(0).lower()
        known = next(((bw, tf) for key, bw, tf in DEVICE_PEAKS if key in name), None)
        if known is None and (args.bandwidth_gbs is None or args.peak_tflops is None):
            sys.exit(f"no datasheet figures for {name!r}: pass --bandwidth-gbs and --peak-tflops")
        bandwidth, peak = known or (args.bandwidth_gbs, args.peak_tflops)
        return args.bandwidth_gbs or bandwidth, args.peak_tflops or peak, False
    nominal = args.bandwidth_gbs is None or args.peak_tflops is None
    return args.bandwidth_gbs or CPU_NOMINAL[0], args.peak_tflops or CPU_NOMINAL[1], nominal


def model_directory(args) -> Path:
    """`--model`, else the tiny model (smoke) or the 0.6B-shape model, built into `.cache/` when missing."""
    from unstable.models import ensure_shaped_model, ensure_tiny_model

    if args.model:
        return Path(args.model).resolve()
    tiny = ensure_tiny_model(CACHE / "tiny-qwen3")
    return tiny if args.smoke else ensure_shaped_model(CACHE / "qwen3-0.6b-shape", tiny)


def run_config(model_dir: Path, sizes: Sizes, args):
    """`examples/single-gpu.yaml` on `model_dir` with the transformers engine taking every game into its batch,
    no evaluation and no TensorBoard or W&B; to smoke, on the CPU in float32 with a few games."""
    from unstable.config import load_config

    overrides = [
        f"model.path={model_dir}",
        "inference.backend=transformers",
        f"inference.max_new_tokens={sizes.loop_new_tokens}",
        "collector.num_eval_workers=0",
        "evaluation.games_at_start=0",
        "evaluation.games_at_end=0",
        f"learner.num_steps={sizes.loop_steps}",
        "run.name=bench-gpu",
        f"run.dir={args.run_dir}",
        "tracker.tensorboard=false",
        "tracker.wandb=disabled",
    ]
    if sizes.loop_workers:
        overrides += [f"collector.num_workers={sizes.loop_workers}", f"learner.batch_size={2 * sizes.loop_workers}"]
    if args.smoke:
        overrides += ["model.dtype=float32", "inference.num_gpus=0", "learner.num_gpus=0"]
    cfg = load_config(ROOT / "examples" / "single-gpu.yaml", overrides)
    inference = cfg.inference.model_copy(update={"max_batch_size": cfg.collector.num_workers})
    return cfg.model_copy(update={"inference": inference})


def model_shape(model_dir: Path) -> ModelShape:
    """The shape of the model at `model_dir` (built on the meta device: no weights are read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return ModelShape(
        layer_weights=sum(p.numel() for p in model.get_decoder().layers.parameters()),
        vocab=c.vocab_size,
        hidden=c.hidden_size,
        layers=c.num_hidden_layers,
        attention_width=c.num_attention_heads * head_dim,
        kv_width=c.num_key_value_heads * head_dim,
    )


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so wall time covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def release_memory(device: str) -> None:
    """Free what the finished part left (its models are out of scope) and reset the peak-memory counter."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gb(device: str) -> float | None:
    """This process's peak GPU memory since the last reset (None on the CPU)."""
    return torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None


def running_batch(backend, prompts: list[list[int]], max_new_tokens: int):
    """The engine's running batch with every prompt a prefilled row that no token ends (no eos: -1 is no token)
    before `max_new_tokens`, sampled at temperature 1."""
    from unstable.inference import SamplingConfig

    batch = backend.new_batch(SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0), eos_token_id=-1)
    refill(batch, prompts)
    return batch


def refill(batch, prompts: list[list[int]]) -> None:
    """Empty `batch` (keeping its cache and captured steps) and prefill every prompt as a row."""
    from unstable.inference.decoding import Row

    batch.clear()
    batch.add([Row(i, ids, None) for i, ids in enumerate(prompts)])


def decode_timings(batch, prompts: list[list[int]], sizes: Sizes) -> dict[str, float]:
    """Tokens/s of the engine's decode steps on `batch` (a `running_batch`) with every prompt a row (prefill and
    warm-up steps not timed), and the milliseconds of a whole step and of its forward alone (on a GPU the replayed
    graph; the rest of a step is sampling and the rows' bookkeeping). The steps run three times: the first pass
    captures the CUDA graph of every bucket the timed ones replay (a capture costs ~3 eager steps)."""

    def forward():  # the step's forward alone, the rows left as they are
        batch.cache.decode(batch.next_tokens)

    seconds = {}
    for name, step in (("capturing", batch.step), ("step", batch.step), ("forward", forward)):
        refill(batch, prompts)
        for _ in range(sizes.decode_warmup):
            batch.step()
        synchronize(batch.device)
        start = time.perf_counter()
        for _ in range(sizes.decode_steps):
            step()
        synchronize(batch.device)
        seconds[name] = (time.perf_counter() - start) / sizes.decode_steps
    return {
        "tokens_per_s": len(prompts) / seconds["step"],
        "step_ms": 1e3 * seconds["step"],
        "forward_ms": 1e3 * seconds["forward"],
    }


def decode_profile(batch, prompts: list[list[int]], sizes: Sizes, rows: int = 12) -> list[str]:
    """torch.profiler's operators of 3 decode steps of `batch` (its graphs captured by `decode_timings`), sorted
    by device time (self CPU time on the CPU): where a replayed step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    refill(batch, prompts)
    for _ in range(sizes.decode_warmup):
        batch.step()
    cuda = batch.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            batch.step()
        synchronize(batch.device)
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=50).splitlines()


def decode_part(cfg, model_dir: Path, sizes: Sizes, bandwidth_gbs: float, compile: bool) -> list[dict]:
    """A row per decode batch size: tokens/s against the weight-bandwidth bound and the bound with KV-cache reads,
    of the engine as the loop builds it (slot cache, CUDA graphs on a GPU) with `inference.compile` = `compile`."""
    from unstable.inference.transformers_backend import TransformersBackend
    from unstable.models import weight_bytes

    dtype_bytes = torch.finfo(getattr(torch, cfg.model.dtype)).bits // 8
    weights = weight_bytes(model_dir, dtype_bytes)
    shape = model_shape(model_dir)
    kv_bytes_per_token = 2 * shape.layers * shape.kv_width * dtype_bytes
    device = cfg.inference.device
    if cfg.inference.num_threads:  # as `make_backend` sets them (its GPU memory cap would hold the parts after)
        torch.set_num_threads(cfg.inference.num_threads)
    sampling = cfg.inference.sampling
    backend = TransformersBackend(
        str(model_dir), sampling, dtype=cfg.model.dtype, device=device, max_model_len=1024, compile=compile
    )
    texts = loop_bench.game_prompts(backend.tokenizer, max(sizes.decode_batches))
    prompts = [backend.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    rows = []
    for batch in sizes.decode_batches:
        running = running_batch(backend, prompts[:batch], sizes.decode_warmup + sizes.decode_steps + 2)
        timings = decode_timings(running, prompts[:batch], sizes)
        tokens_per_s = timings["tokens_per_s"]
        mean_context = sum(map(len, prompts[:batch])) / batch + sizes.decode_warmup + 1 + sizes.decode_steps / 2
        kv_bytes = batch * mean_context * kv_bytes_per_token
        bound = batch * bandwidth_gbs * 1e9 / weights
        rows.append(
            {
                "batch": batch,
                "tokens_per_s": tokens_per_s,
                "bound_tokens_per_s": bound,
                "fraction_of_bound": tokens_per_s / bound,
                "weight_bytes": weights,
                "kv_bytes_per_step": kv_bytes,
                "fraction_of_bound_with_kv": tokens_per_s / (batch * bandwidth_gbs * 1e9 / (weights + kv_bytes)),
                "mean_context_tokens": mean_context,
                "step_ms": timings["step_ms"],
                "forward_ms": timings["forward_ms"],
                "profile": decode_profile(running, prompts[:batch], sizes) if batch in PROFILED_BATCHES else None,
            }
        )
        print(
            f"  decode batch {batch}: {tokens_per_s:,.0f} tokens/s, {rows[-1]['fraction_of_bound']:.2%} of bound, "
            f"{rows[-1]['fraction_of_bound_with_kv']:.2%} with KV reads; step {timings['step_ms']:.2f} ms, forward "
            f"{timings['forward_ms']:.2f} ms"
        )
    rows[-1]["peak_gpu_gb"] = peak_memory_gb(device)
    backend.close()
    return rows


def decode_variants(cfg, model_dir: Path, sizes: Sizes, bandwidth_gbs: float, choice: str, cuda: bool) -> dict:
    """`decode_part` with the engine compiled and not, as `--compile` asks (auto: both on a GPU, not compiled on
    the CPU); a variant that fails records its error. `chosen` is the faster at the largest batch."""
    flags = {"auto": (False, True) if cuda else (False,), "on": (True,), "off": (False,)}[choice]
    variants: dict[str, list | str] = {}
    for compile in flags:
        name = "compiled" if compile else "eager"
        try:
            variants[name] = decode_part(cfg, model_dir, sizes, bandwidth_gbs, compile)
        except Exception as exc:  # noqa: BLE001 - recorded, and the other variant goes on
            print(f"  decode, {name}: failed: {exc!r}")
            variants[name] = repr(exc)
        release_memory(cfg.inference.device)
    measured = {name: rows for name, rows in variants.items() if isinstance(rows, list)}
    if not measured:
        raise RuntimeError(f"no decode variant ran: {variants}")
    chosen = max(measured, key=lambda name: measured[name][-1]["tokens_per_s"])
    return {"chosen": chosen, "rows": measured[chosen], "variants": variants}


def synthetic_steps(vocab: int, sizes: Sizes) -> list:
    """One update's steps: random token ids, alternating rewards +1 and -1 (so the gradient is not zero)."""
    from unstable.records import Step

    prompt, completion = sizes.prompt_tokens, sizes.completion_tokens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(vocab, (sizes.learner_steps, prompt + completion), generator=generator).tolist()
    return [
        Step(
            env_id="bench",
            player_id=0,
            turn=0,
            observation="",
            action="",
            prompt_token_ids=tuple(row[:prompt]),
            completion_token_ids=tuple(row[prompt:]),
            behaviour_logprobs=(-1.0,) * completion,
            reward=1.0 if i % 2 else -1.0,
        )
        for i, row in enumerate(ids)
    ]


def update_flops(shape: ModelShape, steps: list, adapter_weights: int | None) -> float:
    """Model FLOPs of one update on `steps` (the module docstring's formulas); `adapter_weights` None: full."""
    lengths = [len(s.prompt_token_ids) + len(s.completion_token_ids) for s in steps]
    tokens, targets = sum(lengths), sum(len(s.completion_token_ids) for s in steps)
    head = shape.vocab * shape.hidden
    attention = 6 * shape.layers * shape.attention_width * sum(t * t for t in lengths)
    if adapter_weights is None:
        return 6 * shape.layer_weights * tokens + 6 * head * targets + attention
    return 4 * shape.layer_weights * tokens + 6 * adapter_weights * tokens + 4 * head * targets + attention


def example_learner(cfg, model_dir: Path, lora: bool, **policy):
    """The example's learner on `model_dir`, initialized: with its LoRA adapter, or with `lora` False every weight
    trained; `policy` overrides settings of `learner.policy`."""
    from unstable.learner import Learner

    policy_cfg = cfg.learner.policy.model_copy(update=policy | ({} if lora else {"lora": None}))
    learner_cfg = cfg.learner.model_copy(update={"policy": policy_cfg})
    learner = Learner.build(str(model_dir), learner_cfg.algorithm.build(), learner_cfg, dtype=cfg.model.dtype)
    learner.initialize()
    return learner


LEARNER_VARIANTS = {  # learner.policy settings beside the example's, each timed as learner_part times it
    "no_checkpointing_8k": {"gradient_checkpointing": False, "micro_batch_tokens": 8192},
    "no_checkpointing_16k": {"gradient_checkpointing": False, "micro_batch_tokens": 16384},
    "checkpointing_64k": {"gradient_checkpointing": True, "micro_batch_tokens": 65536},  # an update in one pass
}


def learner_part(cfg, model_dir: Path, sizes: Sizes, peak_tflops: float, lora: bool, **policy) -> dict:
    """MFU of the example's learner (LoRA, or with `lora` False every weight) on `synthetic_steps`, with `policy`
    overriding its `learner.policy` settings."""
    from unstable.tracking import keys

    learner = example_learner(cfg, model_dir, lora, **policy)
    policy_model, policy_cfg = learner.policy, learner.cfg.policy
    shape = model_shape(model_dir)
    steps = synthetic_steps(shape.vocab, sizes)
    learner.train_step(steps)  # warm-up: kernels, allocator, optimizer state
    synchronize(policy_model.device)
    start = time.perf_counter()
    for _ in range(sizes.learner_updates):
        metrics = learner.train_step(steps)
    synchronize(policy_model.device)
    seconds = (time.perf_counter() - start) / sizes.learner_updates
    adapter_weights = sum(p.numel() for p in policy_model.trainable_parameters()) if lora else None
    flops = update_flops(shape, steps, adapter_weights)
    mfu = flops / seconds / (peak_tflops * 1e12)
    print(f"  learner {'LoRA' if lora else 'full'} {policy or ''}: {seconds:.2f} s per update, MFU {mfu:.2%}")
    return {
        "lora_rank": policy_cfg.lora.lora_rank if lora else None,
        "steps_per_update": len(steps),
        "tokens_per_update": sizes.learner_steps * (sizes.prompt_tokens + sizes.completion_tokens),
        "completion_tokens_per_step": sizes.completion_tokens,
        "flops_per_update": flops,
        "seconds_per_update": seconds,
        "mfu": mfu,
        "grad_norm": metrics[keys.GRAD_NORM],
        "gradient_checkpointing": policy_cfg.gradient_checkpointing,
        "micro_batch_tokens": policy_cfg.micro_batch_tokens,
        "peak_gpu_gb": peak_memory_gb(policy_model.device),
    }


def learner_variants(cfg, model_dir: Path, sizes: Sizes, peak_tflops: float) -> dict:
    """`learner_part` of both kinds under each of `LEARNER_VARIANTS` (one that fails, out of memory say, records
    its error), with the whole GPU (the bare engine's part capped this process at the engine's share)."""
    if cfg.learner.device == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0)
    results: dict[str, dict] = {}
    for name, policy in LEARNER_VARIANTS.items():
        for kind in ("lora", "full"):
            try:
                results[f"{kind}_{name}"] = learner_part(cfg, model_dir, sizes, peak_tflops, kind == "lora", **policy)
            except Exception as exc:  # noqa: BLE001 - recorded; the next variant goes on
                print(f"  learner {kind} {name}: failed: {exc!r}")
                results[f"{kind}_{name}"] = {"error": repr(exc)}
            release_memory(cfg.learner.device)
    return results


def learner_profile(cfg, model_dir: Path, sizes: Sizes, rows: int = 25) -> list[str]:
    """torch.profiler's table of one update of the example's full fine-tuning learner (after a warm-up), the
    operators sorted by device time (self CPU time on the CPU): where an update's time goes."""
    from torch.profiler import ProfilerActivity, profile

    learner = example_learner(cfg, model_dir, lora=False)
    steps = synthetic_steps(model_shape(model_dir).vocab, sizes)
    learner.train_step(steps)
    device = learner.policy.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        learner.train_step(steps)
        synchronize(device)
    sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)
    print(table)
    return table.splitlines()


SYNC_PHASES = ("export", "load", "first_token")  # a handover's phases, timed one after the other


def hand_over(learner, backend, kind: str, path: str, checkpoint, prompt: str) -> dict[str, float]:
    """The learner's current weights into the engine by `path` (in memory, or through `checkpoint.path`, a folder
    to save into), then one token sampled with them: the seconds of each of `SYNC_PHASES` (the learner's tensors or
    folder, loading them into the engine, the first token)."""
    from unstable.records import GenerationRequest

    device = backend.device
    marks = [time.perf_counter()]
    if path == "in_memory":
        config, tensors = learner.policy.served_weights()
    else:
        checkpoint = replace(checkpoint, path=learner.save_checkpoint(checkpoint.path))
    synchronize(device)
    marks.append(time.perf_counter())
    if path == "in_memory" and kind == "lora":
        backend.load_adapter_tensors(checkpoint.uid, config, tensors)
    elif path == "in_memory":
        backend.load_weight_tensors(tensors)
    elif kind == "lora":
        backend.load_adapter(checkpoint)
    else:
        backend.load_weights(checkpoint.path)
    synchronize(device)
    marks.append(time.perf_counter())
    backend.generate([GenerationRequest(prompt, checkpoint if kind == "lora" else None)])
    synchronize(device)
    marks.append(time.perf_counter())
    return {phase: end - start for phase, start, end in zip(SYNC_PHASES, marks, marks[1:])}


def weight_sync_part(cfg, model_dir: Path, sizes: Sizes, rounds: int = 3) -> dict:
    """Seconds from the end of a learner update to the first token sampled with its weights, in one process on one
    device: handed over in memory (`PolicyModel.served_weights` into the engine) and through a checkpoint folder
    (save, then load from disk, as the loop did before), for a LoRA adapter and for full weights, with the median
    of each phase (`hand_over`; the phases are synchronized, which their sum pays for). The engine is the loop's
    (`inference.compile` as chosen), the learner the example's; an update is `Sizes.learner_steps` rows of
    `prompt_tokens` + 16 completion tokens."""
    from unstable.inference import SamplingConfig
    from unstable.inference.transformers_backend import TransformersBackend
    from unstable.records import Checkpoint

    device = cfg.inference.device
    short = replace(sizes, completion_tokens=16)
    result: dict[str, dict] = {}
    for kind in ("lora", "full"):
        backend = TransformersBackend(
            str(model_dir),
            SamplingConfig(max_new_tokens=1),
            dtype=cfg.model.dtype,
            device=device,
            compile=cfg.inference.compile,
        )
        prompt = loop_bench.game_prompts(backend.tokenizer, 1, openings_only=True)[0]
        learner = example_learner(cfg, model_dir, lora=kind == "lora")
        steps = synthetic_steps(model_shape(model_dir).vocab, short)
        phases: dict[str, list[dict[str, float]]] = {"in_memory": [], "checkpoint_folder": []}
        with tempfile.TemporaryDirectory(prefix="gpu-bench-") as folder:
            for round_ in range(rounds + 1):  # the first round warms up both paths
                for path in phases:
                    learner.train_step(steps)
                    synchronize(device)
                    uid = f"{kind}-{round_}-{path}"
                    checkpoint = Checkpoint(uid, str(Path(folder) / uid), round_, kind)
                    timing = hand_over(learner, backend, kind, path, checkpoint, prompt)
                    if round_:
                        phases[path].append(timing)
                    if kind == "lora":
                        backend.unload_adapter(uid)
        backend.close()
        del learner
        release_memory(device)
        totals = {path: [sum(t.values()) for t in timings] for path, timings in phases.items()}
        result[kind] = {path: statistics.median(times) for path, times in totals.items()} | {
            "rounds": totals,
            "phases": {
                path: {p: statistics.median(t[p] for t in timings) for p in SYNC_PHASES}
                for path, timings in phases.items()
            },
        }
        print(
            f"  weight sync {kind}: "
            + ", ".join(
                f"{path} {result[kind][path]:.3f} s ("
                + ", ".join(f"{p} {s:.3f}" for p, s in result[kind]["phases"][path].items())
                + ")"
                for path in phases
            )
        )
    return result


def bare_part(cfg, model_dir: Path, sizes: Sizes, adapter: str) -> dict:
    """The loop's engine alone at the loop's concurrency, on the base model and on the run's last adapter. Last
    part: on a GPU `make_backend` caps this process's memory at the engine's share."""
    from unstable.inference import make_backend

    backend = make_backend(str(model_dir), cfg.inference, dtype=cfg.model.dtype, seed=cfg.run.seed)
    try:
        workers = cfg.collector.num_workers
        prompts = loop_bench.game_prompts(backend.tokenizer, (sizes.bare_rounds + 1) * workers, openings_only=True)
        base = loop_bench.measure_bare(backend, prompts, workers)
        lora = loop_bench.measure_bare(backend, prompts, workers, adapter)
    finally:
        backend.close()
    print(f"  bare engine @ {workers}: {base['tokens_per_s']:,.0f} tokens/s base, {lora['tokens_per_s']:,.0f} LoRA")
    return {"base": base, "lora": lora}


@contextmanager
def timed(part: str, elapsed: dict[str, float], device: str):
    """Time a part into `elapsed[part]`, print it with the running total, then free its memory."""
    print(f"[{part}]", flush=True)
    start = time.perf_counter()
    yield
    elapsed[part] = time.perf_counter() - start
    release_memory(device)
    print(f"[{part}] {elapsed[part]:.1f} s (total {sum(elapsed.values()):.1f} s)", flush=True)


def headline(result: dict) -> dict[str, float]:
    """The top-level fractions and seconds of the JSON, of the parts `result` holds."""
    top = {}
    for row in result.get("decode", ()):
        top[f"decode_fraction_of_bound_b{row['batch']}"] = row["fraction_of_bound"]
        top[f"decode_fraction_of_bound_with_kv_b{row['batch']}"] = row["fraction_of_bound_with_kv"]
    for kind in ("lora", "full"):
        if kind in result.get("learner", {}):
            top[f"learner_mfu_{kind}"] = result["learner"][kind]["mfu"]
        if kind in result.get("weight_sync", {}):
            top[f"weight_sync_seconds_{kind}"] = result["weight_sync"][kind]["in_memory"]
    if "bare" in result:
        top["loop_over_bare"] = result["loop"]["tokens_per_s"] / result["bare"]["lora"]["tokens_per_s"]
        top["loop_over_bare_base"] = result["loop"]["tokens_per_s"] / result["bare"]["base"]["tokens_per_s"]
    return top


def print_table(result: dict) -> None:
    """The headline fractions and seconds with the figures behind them."""
    decode = {row["batch"]: row for row in result["decode"]}
    loop, bare, sync = result["loop"], result["bare"], result["weight_sync"]
    details = {}
    for b, r in decode.items():
        details[f"decode_fraction_of_bound_b{b}"] = f"{r['tokens_per_s']:,.0f} of {r['bound_tokens_per_s']:,.0f} tok/s"
        details[f"decode_fraction_of_bound_with_kv_b{b}"] = f"{r['kv_bytes_per_step'] / 1e9:.2f} GB of KV per step"
    for kind in ("lora", "full"):
        learner = result["learner"][kind]
        details[f"learner_mfu_{kind}"] = (
            f"{learner['seconds_per_update']:.2f} s / {learner['tokens_per_update']:,} tokens"
        )
        details[f"weight_sync_seconds_{kind}"] = f"through a checkpoint folder: {sync[kind]['checkpoint_folder']:.3f} s"
    details["loop_over_bare"] = (
        f"{loop['tokens_per_s']:,.0f} vs {bare['lora']['tokens_per_s']:,.0f} tok/s @ {loop['workers']} "
        f"(base model: {bare['base']['tokens_per_s']:,.0f})"
    )
    nominal = " (nominal peaks: only shows the code runs)" if result["nominal_peaks"] else ""
    total = sum(result["elapsed_s"].values())
    print(f"\n{result['device']}; {result['bandwidth_gbs']:,.0f} GB/s, {result['peak_tflops']:,.0f} TFLOPS{nominal}")
    print(
        f"decode {result['decode_engine']}; {total:.0f} s in all: "
        + ", ".join(f"{part} {s:.0f} s" for part, s in result["elapsed_s"].items())
    )
    print(f"{'measure':<40}{'value':>10}  detail")
    for key, detail in details.items():
        print(f"{key:<40}{result[key]:>10.4f}  {detail}")


def main() -> None:
    """Run every part, writing the JSON after each (a run cut short keeps what it measured), then print the table."""
    args = parse_args()
    sizes = SMOKE if args.smoke else FULL
    cuda = not args.smoke and torch.cuda.is_available()
    if not args.smoke and not cuda:
        sys.exit("gpu.py measures a CUDA GPU; on a CPU run it with --smoke")
    bandwidth_gbs, peak_tflops, nominal = device_peaks(cuda, args)
    device = "cuda" if cuda else "cpu"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    elapsed: dict[str, float] = {}
    result = {
        "device": device_description(cuda),
        "commit": os.environ.get("UNSTABLE_COMMIT") or commit(),
        "packages": package_versions(),
        "complete": False,
        "smoke": args.smoke,
        "nominal_peaks": nominal,
        "bandwidth_gbs": bandwidth_gbs,
        "peak_tflops": peak_tflops,
        "sizes": asdict(sizes),
        "elapsed_s": elapsed,
    }

    def save() -> None:  # after every part, so a run cut short keeps what it measured
        atomic.write_text(out, json.dumps(headline(result) | result, indent=2))

    parts = set(args.parts)
    with timed("model", elapsed, device):
        model_dir = model_directory(args)
        cfg = run_config(model_dir, sizes, args)
    model_name = model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir  # no machine paths
    result |= {"model": str(model_name), "dtype": cfg.model.dtype, "parts": args.parts}
    compile = args.compile == "on"
    if "decode" in parts:
        with timed("decode", elapsed, device):
            decode = decode_variants(cfg, model_dir, sizes, bandwidth_gbs, args.compile, cuda)
        result |= {"decode": decode["rows"], "decode_engine": decode["chosen"], "decode_variants": decode["variants"]}
        compile = decode["chosen"] == "compiled"
        save()
    cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"compile": compile})})
    if "learner" in parts:
        result["learner"] = {}
        for kind in ("lora", "full"):
            with timed(f"learner {kind}", elapsed, device):
                result["learner"][kind] = learner_part(cfg, model_dir, sizes, peak_tflops, lora=kind == "lora")
            save()
    if "sync" in parts:
        with timed("weight sync", elapsed, device):
            result["weight_sync"] = weight_sync_part(cfg, model_dir, sizes)
        save()
    if "loop" in parts:
        with timed("loop", elapsed, device):
            loop = result["loop"] = loop_bench.measure_loop(cfg)
            print(
                f"  loop @ {loop['workers']}: {loop['tokens_per_s']:,.0f} tokens/s, {loop['learner_s_per_step']:.2f} "
                f"s/step, weight sync {loop['weight_sync_seconds']:.3f} s/step"
            )
        save()
        with timed("bare engine", elapsed, device):
            result["bare"] = bare_part(cfg, model_dir, sizes, loop["last_checkpoint"])
        save()
    if "variants" in parts:
        with timed("learner variants", elapsed, device):
            result["learner_variants"] = learner_variants(cfg, model_dir, sizes, peak_tflops)
        save()
    if "profile" in parts:
        with timed("learner profile", elapsed, device):
            result["learner_profile"] = learner_profile(cfg, model_dir, sizes)
    result["complete"] = parts == set(PARTS)
    save()
    if {"decode", "learner", "sync", "loop"} <= parts:
        print_table(headline(result) | result)
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
