"""A fix loaded into vLLM's CPU worker process: base-model rows of a mixed LoRA batch get no adapter.

vLLM's PyTorch LoRA ops (the CPU path) gather `weights[indices]` where rows without an adapter have index -1,
which selects the last adapter slot: a base-model request batched with LoRA requests silently gets that
adapter's delta (vllm-project/vllm PRs #48421 and #49656, open against vLLM 0.32; the GPU Triton kernels skip
-1). vLLM imports this module in the worker because `VLLMBackend` names `SkipRowsWithoutLora` as its
`worker_extension_cls` on CPU; the import wraps the ops so those rows read zeros from slot 0 and add nothing.
Drop it once the installed vLLM contains the fix.
"""

from __future__ import annotations

import functools

from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

PATCHED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")  # the sgmv ops call these through lora_ops


def skip_rows_without_lora(op):
    """Wrap a bgmv op so rows with index -1 contribute exactly zero instead of the last slot's delta."""

    @functools.wraps(op)
    def wrapped(inputs, weights, output, indices, *args, **kwargs):
        no_lora = indices < 0
        if no_lora.any():
            inputs = inputs.masked_fill(no_lora.unsqueeze(-1), 0)
            indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kwargs)

    return wrapped


for _name in PATCHED_OPS:
    _fixed = skip_rows_without_lora(getattr(lora_ops, _name))
    setattr(lora_ops, _name, _fixed)
    setattr(punica_cpu, _name, _fixed)


class SkipRowsWithoutLora:
    """The worker extension vLLM imports on CPU; importing it applies the fix (it adds no methods)."""
