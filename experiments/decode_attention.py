"""A decode step's attention alone, five ways, on the KV-cache shapes of the embedded engine's slot cache: where the
batch-128 decode step of the Qwen3-0.6B shape spends most of its GPU time (an H200 read the keys and values at about
1.5 of its 4.8 TB/s through PyTorch's memory-efficient SDPA kernel, experiments/log.md).

    python experiments/decode_attention.py [--out experiments/results/decode_attention.json]
    python experiments/decode_attention.py --smoke --out /tmp/decode_attention.json   # CPU, small shapes (tests)

Each way attends one query token per row (G query heads per key head) over the first L columns of every row's slot,
through an additive mask that hides each row's columns past its own length (rows of lengths spread over L/2..L):

- `sdpa_slot_major`: the cache laid out `(slots, columns, kv_heads, head_dim)` (the engine's layout), the columns
  read through a transposed view, `F.scaled_dot_product_attention` with the mask;
- `sdpa_head_major`: laid out `(slots, kv_heads, columns, head_dim)`, so each head's columns are contiguous;
- `matmul_head_major`: the head-major cache, scores by one batched matrix product, softmax in float32, one more
  product with the values;
- `matmul_head_major_compiled`: the same under `torch.compile`;
- `flex_head_major`: `flex_attention` (compiled) over the head-major cache, each row's length as its block mask.

A layer's time is the median over `--repeats` passes through `--layers` layers (each layer its own cache, so that
nothing is read from the L2 cache); its bandwidth counts the keys and values of the L columns read. Every way's output
is checked against the first's; a way that fails (flex_attention does not compile for every batch on the CPU)
records its error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu import synchronize  # noqa: E402 - benchmarks/gpu.py: waits for the GPU as its rows do

QWEN3_06B = {"kv_heads": 8, "groups": 2, "head_dim": 128}  # 16 query heads over 8 key-value heads


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results" / "decode_attention.json"))
    parser.add_argument("--smoke", action="store_true", help="CPU-sized shapes and repeats (shows that it runs)")
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 32, 1])
    parser.add_argument("--lengths", type=int, nargs="+", default=[288], help="columns read (length buckets)")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS), help="the ways to time")
    return parser.parse_args()


def slot_major(k: torch.Tensor, length: int) -> torch.Tensor:
    """`(B, Hkv, L, D)` view of a `(B, C, Hkv, D)` cache's first `length` columns."""
    return k[:, :length].transpose(1, 2)


def head_major(k: torch.Tensor, length: int) -> torch.Tensor:
    """`(B, Hkv, L, D)` view of a `(B, Hkv, C, D)` cache's first `length` columns."""
    return k[:, :, :length]


def sdpa(q, k, v, mask, scale):
    """PyTorch's fused attention (the kernel it picks for the mask)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def matmul(q, k, v, mask, scale):
    """Scores by one batched product, softmax in float32, a second product with the values."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)


def flex(q, k, v, mask, scale):
    """`flex_attention` (compiled; on a GPU its decode kernel splits the columns), the mask as one per row
    length: `mask` here is the rows' lengths `(B,)`."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch, heads, groups, dim = q.shape
    block = create_block_mask(lambda b, h, i, j: j < mask[b], batch, None, 1, k.shape[2], device=q.device.type)
    out = flex_attention(q.reshape(batch, heads * groups, 1, dim), k, v, block_mask=block, scale=scale, enable_gqa=True)
    return out.view(batch, heads, groups, dim)


WAYS = {  # name: (layout, attention, compiled)
    "sdpa_slot_major": (slot_major, sdpa, False),
    "sdpa_head_major": (head_major, sdpa, False),
    "matmul_head_major": (head_major, matmul, False),
    "matmul_head_major_compiled": (head_major, matmul, True),
    "flex_head_major": (head_major, flex, True),
}


def caches(layout, layers: int, batch: int, columns: int, shape: dict, device: str, dtype) -> list:
    """One (keys, values) per layer in `layout`, random (the same values in either layout)."""
    size = (batch, columns, shape["kv_heads"], shape["head_dim"])
    generator = torch.Generator(device=device).manual_seed(0)
    made = []
    for _ in range(layers):
        k, v = (torch.randn(size, generator=generator, device=device, dtype=dtype) for _ in range(2))
        made.append(
            (k, v) if layout is slot_major else (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        )
    return made


def row_lengths(batch: int, length: int, device: str) -> torch.Tensor:
    """`(B,)` each row's length, spread over L/2..L."""
    return torch.linspace(length // 2, length, batch, device=device).long()


def masks(batch: int, length: int, groups: int, device: str, dtype) -> torch.Tensor:
    """`(B, Hkv=1, G, L)` additive mask: row b sees its first `lengths[b]` columns (spread over L/2..L)."""
    visible = torch.arange(length, device=device)[None, :] < row_lengths(batch, length, device)[:, None]  # (B, L)
    mask = torch.zeros(batch, length, device=device, dtype=dtype).masked_fill(~visible, -torch.inf)
    return mask[:, None, None, :].expand(batch, 1, groups, length)


def time_way(name: str, batch: int, length: int, args, shape: dict, device: str, dtype):
    """(median seconds per layer, the first layer's output) of way `name`."""
    layout, kind, compiled = WAYS[name]
    attend = torch.compile(kind, dynamic=False) if compiled else kind
    columns = 2 * length  # the slot cache is wider than the bucket a step reads
    layers = caches(layout, args.layers, batch, columns, shape, device, dtype)
    heads, groups, dim = shape["kv_heads"], shape["groups"], shape["head_dim"]
    generator = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(batch, heads, groups, dim, device=device, dtype=dtype, generator=generator)
    if kind is flex:
        mask = row_lengths(batch, length, device)
    else:
        mask = masks(batch, length, groups, device, torch.float32 if kind is matmul else dtype)
    scale = dim**-0.5

    def one_pass():
        return [attend(q, layout(k, length), layout(v, length), mask, scale) for k, v in layers]

    first = one_pass()[0]  # warm-up (and the compile)
    times = []
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        one_pass()
        synchronize(device)
        times.append((time.perf_counter() - start) / args.layers)
    return statistics.median(times), first


def measure_batch(batch: int, length: int, args, shape: dict, device: str, dtype) -> list[dict]:
    """One row per way at `batch` rows over `length` columns (a way that fails records its error)."""
    kv_bytes = 2 * batch * length * shape["kv_heads"] * shape["head_dim"] * torch.finfo(dtype).bits // 8
    rows, reference = [], None
    for name in args.ways:
        try:
            seconds, out = time_way(name, batch, length, args, shape, device, dtype)
        except Exception as exc:  # noqa: BLE001 - recorded (flex_attention fails to compile on some CPUs)
            rows.append({"way": name, "batch": batch, "length": length, "error": repr(exc)[:300]})
            print(f"{name:<28} B={batch:<4} L={length:<5} failed: {repr(exc)[:120]}", flush=True)
            continue
        reference = out if reference is None else reference
        error = (out.float() - reference.float()).abs().max().item()
        gb_per_s = kv_bytes / seconds / 1e9
        rows.append(
            {
                "way": name,
                "batch": batch,
                "length": length,
                "us_per_layer": seconds * 1e6,
                "kv_gb_per_s": gb_per_s,
                "max_abs_diff": error,
            }
        )
        print(
            f"{name:<28} B={batch:<4} L={length:<5} {seconds * 1e6:9.1f} us/layer {gb_per_s:8.1f} GB/s  "
            f"diff {error:.2e}",
            flush=True,
        )
    return rows


def main() -> None:
    """Every way at every batch and length, the JSON written after each batch."""
    args = parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shape = dict(QWEN3_06B)
    if args.smoke:
        shape |= {"kv_heads": 2, "head_dim": 16}
        args.batches, args.lengths, args.layers, args.repeats = [1, 4], [32], 2, 2
    rows: list[dict] = []
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "shape": shape,
        "layers": args.layers,
        "repeats": args.repeats,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for length in args.lengths:
        for batch in args.batches:
            rows += measure_batch(batch, length, args, shape, device, dtype)
            out.write_text(json.dumps(result, indent=1))  # after every batch: a run cut short keeps its rows
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
