"""The inference servers' settings: backend, sampling, batching, adapters and resources."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from unstable.inference.base import SamplingConfig
from unstable.settings import MAX_THREADS, Settings, check_registered


class InferenceConfig(Settings):
    """The inference engine (`backend`, one of `inference.BACKENDS`), its sampling and its batching."""

    backend: str = Field("transformers", description="the engine, one of `inference.BACKENDS`")
    max_new_tokens: int = Field(64, ge=1, description="most tokens generated per move")
    temperature: float = Field(1.0, ge=0.0, description="0: greedy")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="nucleus sampling (1: off); log-probs are the cut, renormalised distribution's"
    )
    max_batch_size: int = Field(64, ge=1, description="requests per forward pass (transformers backend)")
    batch_wait_ms: float = Field(5.0, ge=0.0, description="how long a batch waits for more requests")
    max_loras: int = Field(4, ge=1, description="LoRA adapters resident at once")
    max_model_len: int = Field(
        4096, ge=16, description="context length: a prompt must leave room for max_new_tokens in it"
    )
    prefix_cache_tokens: int = Field(
        8192, ge=0, description="prompt-prefix KV cache of the transformers engine, in tokens (0: off)"
    )
    cuda_graphs: bool = Field(
        True,
        description="transformers engine on a GPU: replay each decode step as a CUDA graph captured per batch and "
        "context-length bucket (Llama-family models; others decode eagerly)",
    )
    compile: bool = Field(
        False,
        description="transformers engine: `torch.compile` the decoder layer of the decode step and of prefills "
        "(fused kernels; compiled once for every layer when the engine starts serving, again at the first adapter)",
    )
    num_threads: int | None = Field(
        1, ge=1, le=MAX_THREADS, description="torch threads of the inference process (None: torch's choice)"
    )
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs of each inference actor; > 0 serves on cuda")
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="share of its GPU's memory the engine may use (the learner gets the rest)"
    )
    num_actors: int = Field(
        1,
        ge=1,
        le=64,
        description="inference server actors; the collector routes requests over them by `routing` (at most 64: "
        "each holds its own copy of the model)",
    )
    routing: Literal["game", "least_outstanding"] = Field(
        "game",
        description="`game`: each game stays on the actor it first went to (its prompts' prefixes are cached there) "
        "unless that actor has over 2x the least busy one's requests in flight + 2; `least_outstanding`: every "
        "request to the least busy actor",
    )
    max_restarts: int = Field(3, ge=0, description="times Ray restarts an inference actor whose process died")
    resources: dict[str, float] = Field(
        {},
        description="custom Ray resources each inference actor needs, e.g. `{inference_node: 1}` to place it on the "
        "nodes started with `ray start --resources='{\"inference_node\": 8}'` (CPUs and GPUs: `num_gpus`)",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from unstable.inference import BACKENDS

        return check_registered(value, BACKENDS, "inference backend")

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        reserved = sorted(name for name in value if name in ("CPU", "GPU", "memory", "object_store_memory"))
        if reserved:
            raise ValueError(
                f"{reserved}: Ray's own resources, not custom ones (an actor's GPUs are inference.num_gpus)"
            )
        negative = sorted(name for name, amount in value.items() if amount <= 0)
        if negative:
            raise ValueError(f"{negative}: each amount must be > 0")
        return value

    @property
    def device(self) -> str:
        """Where the engine runs: `cuda` when the inference actor is given GPUs, else `cpu`."""
        return "cuda" if self.num_gpus else "cpu"

    @property
    def sampling(self) -> SamplingConfig:
        """How completions are sampled."""
        return SamplingConfig(self.max_new_tokens, self.temperature, self.top_p)
