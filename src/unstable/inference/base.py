"""The inference interface shared by every backend: requests in, token ids and per-token log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from unstable.records import Checkpoint, GenerationRequest, GenerationResult


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled. `temperature == 0` means greedy decoding."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0


def prompt_fits(prompt_ids: list[int], max_model_len: int, sampling: SamplingConfig) -> bool:
    """Whether a prompt leaves room for `max_new_tokens` within the model's context."""
    return len(prompt_ids) <= max_model_len - sampling.max_new_tokens


def prompt_too_long(prompt_ids: list[int]) -> GenerationResult:
    """The result for a prompt that does not fit: no completion, `finish_reason="prompt_too_long"`."""
    return GenerationResult("", tuple(prompt_ids), (), (), finish_reason="prompt_too_long")


def decoded_result(
    tokenizer,
    prompt_ids: list[int],
    tokens: list[int],
    logprobs: list[float],
    finish_reason: str,
    sampling: SamplingConfig,
    cached_prompt_tokens: int = 0,
) -> GenerationResult:
    """A result whose text is the completion decoded without special tokens (the eos token stays in the ids),
    saying the temperature and top_p of `sampling`, which drew the tokens, and how many prompt tokens the prefix
    cache gave."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return GenerationResult(
        text,
        tuple(prompt_ids),
        tuple(tokens),
        tuple(logprobs),
        finish_reason,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        cached_prompt_tokens=cached_prompt_tokens,
    )


class InferenceBackend(ABC):
    """A model server: batched generation with several LoRA adapters resident at once."""

    @abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request in one batch; adapters named by the requests must be loaded first."""

    @abstractmethod
    def load_adapter(self, checkpoint: Checkpoint) -> None:
        """Make `checkpoint` (a LoRA adapter directory) servable under `checkpoint.uid`."""

    @abstractmethod
    def unload_adapter(self, uid: str) -> None:
        """Free the adapter `uid`."""

    def load_weights(self, path: str) -> None:
        """Replace the base weights in place (full fine-tuning) while no request runs (the `InferenceServer`
        waits for that); backends that cannot do it say so."""
        raise NotImplementedError(f"{type(self).__name__} cannot reload full weights")

    def takes_tensors(self, checkpoint: Checkpoint) -> bool:
        """Whether `checkpoint`'s weights can be handed over in memory (`load_adapter_tensors`,
        `load_weight_tensors`) instead of read from its folder; none by default."""
        return False

    def close(self) -> None:  # noqa: B027 - a no-op default, not abstract
        """Release what the backend holds beyond its memory (threads, engine processes); nothing by default."""
