"""Fixes loaded into vLLM's CPU worker process, for two CPU-only bugs of vLLM 0.32.

Base-model rows of a mixed LoRA batch get no adapter. vLLM's PyTorch LoRA ops (the CPU path) gather
`weights[indices]` where rows without an adapter have index -1, which selects the last adapter slot: a base-model
request batched with LoRA requests silently gets that adapter's delta (vllm-project/vllm PRs #48421 and #49656,
open against vLLM 0.32; the GPU Triton kernels skip -1). Importing this module wraps the ops so those rows read
zeros from slot 0 and add nothing.

A tied output layer follows a full-weight reload. The CPU linear layers pack their weights for oneDNN when
loaded; `reload_weights` reloads and repacks the embedding, but the output layer that shares its weight
(`tie_word_embeddings`, e.g. Qwen3 up to 4B) keeps its old packed copy, so logits come from the old weights.
`VLLMBackend.load_weights` calls `repack_tied_lm_head` after each reload.

vLLM imports this module in the worker because `VLLMBackend` names `CPUWorkerFixes` as its `worker_extension_cls`
on CPU. Drop each fix once the installed vLLM contains it.
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


class CPUWorkerFixes:
    """The worker extension vLLM imports on CPU: importing it applies the LoRA fix; `repack_tied_lm_head` is
    called through `collective_rpc`."""

    def repack_tied_lm_head(self) -> None:
        """Repack the output layer from the embedding weight it shares (after a reload; no-op when untied)."""
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        if lm_head is not None and self.model_runner.model_config.hf_text_config.tie_word_embeddings:
            lm_head.quant_method.process_weights_after_loading(lm_head)
