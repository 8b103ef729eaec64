"""Inference: backends (transformers, vLLM) behind one interface, and the batching server around them."""

from __future__ import annotations

import os

from unstable.inference.base import GenerationRequest, GenerationResult, InferenceBackend, SamplingConfig
from unstable.inference.client import InferenceClient
from unstable.inference.server import InferenceServer

BACKENDS = ("transformers", "vllm")


def make_backend(
    backend: str,
    model_path: str,
    sampling: SamplingConfig,
    *,
    dtype: str = "float32",
    max_model_len: int = 4096,
    max_loras: int = 4,
    num_threads: int | None = None,
    seed: int = 0,
    **engine_kwargs,
) -> InferenceBackend:
    """Build a backend by name (runs inside the inference process, so heavy imports happen there).

    "vllm" raises ImportError naming the extra to install when vLLM is missing.
    """
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)
        os.environ["OMP_NUM_THREADS"] = str(num_threads)  # and vLLM's engine core process, which inherits it
    if backend == "transformers":
        from unstable.inference.transformers_backend import TransformersBackend

        return TransformersBackend(model_path, sampling, dtype=dtype, max_model_len=max_model_len, seed=seed)
    if backend == "vllm":
        from unstable.inference.vllm_backend import VLLMBackend

        return VLLMBackend(
            model_path,
            sampling,
            dtype=dtype,
            max_model_len=max_model_len,
            max_loras=max_loras,
            seed=seed,
            **engine_kwargs,
        )
    raise ValueError(f"unknown inference backend {backend!r}; valid: {list(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "GenerationRequest",
    "GenerationResult",
    "InferenceBackend",
    "InferenceClient",
    "InferenceServer",
    "SamplingConfig",
    "make_backend",
]
