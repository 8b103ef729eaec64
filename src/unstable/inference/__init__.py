"""Inference: backends (transformers, vLLM) behind one interface, and the batching server around them."""

from __future__ import annotations

import os

from unstable.inference.base import InferenceBackend, SamplingConfig
from unstable.inference.client import InferenceClient
from unstable.inference.config import InferenceConfig
from unstable.inference.server import InferenceServer

BACKENDS = ("transformers", "vllm")


def make_backend(
    model_path: str, cfg: InferenceConfig, *, dtype: str = "float32", seed: int = 0, lora_rank: int | None = None
) -> InferenceBackend:
    """Build the backend `cfg.backend` names on `cfg.device` (runs inside the inference process, so heavy
    imports happen there). On a GPU the transformers engine is held to `cfg.gpu_memory_utilization` of it.
    `lora_rank` is the largest adapter rank the run serves (None: none declared); vLLM sizes its LoRA slots by it.

    "vllm" raises ImportError naming the extra to install when vLLM is missing.
    """
    if cfg.num_threads:
        import torch

        torch.set_num_threads(cfg.num_threads)
        os.environ["OMP_NUM_THREADS"] = str(cfg.num_threads)  # and vLLM's engine core process, which inherits it
    if cfg.backend == "transformers":
        from unstable.inference.transformers_backend import TransformersBackend

        if cfg.device == "cuda":
            import torch

            torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_utilization)  # a shared GPU keeps room
        return TransformersBackend(
            model_path,
            cfg.sampling,
            dtype=dtype,
            device=cfg.device,
            max_model_len=cfg.max_model_len,
            prefix_cache_tokens=cfg.prefix_cache_tokens,
            seed=seed,
            cuda_graphs=cfg.cuda_graphs and cfg.device == "cuda",
            compile=cfg.compile,
        )
    from unstable.inference.vllm_backend import VLLMBackend

    return VLLMBackend(
        model_path,
        cfg.sampling,
        dtype=dtype,
        max_model_len=cfg.max_model_len,
        max_loras=cfg.max_loras,
        seed=seed,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        lora_rank=lora_rank,
    )


__all__ = [
    "BACKENDS",
    "InferenceBackend",
    "InferenceClient",
    "InferenceConfig",
    "InferenceServer",
    "SamplingConfig",
    "make_backend",
]
