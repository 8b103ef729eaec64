"""The embedded default backend: a transformers model decoded by continuous batching, LoRA adapters per row."""

from __future__ import annotations

from typing import Any

import torch

from unstable.inference import decoding
from unstable.inference.base import (
    GenerationRequest,
    GenerationResult,
    InferenceBackend,
    SamplingConfig,
    decoded_result,
    prompt_fits,
    prompt_too_long,
)
from unstable.inference.decoding import DecodeBatch, PaddedCache, Row, supports_continuous_batching
from unstable.inference.lora import LoRASlots
from unstable.inference.prefix_cache import PrefixCache
from unstable.inference.slot_cache import SlotCache, fuse_projections, supports_slot_decoding
from unstable.records import Checkpoint


class TransformersBackend(InferenceBackend):
    """Serves a causal LM and any number of LoRA adapters; one forward pass mixes adapters row by row (batched
    LoRA, `inference/lora.py`).

    The server drives its continuous batch with `add` and `step`; `generate` completes a batch on its own. Tokens
    are sampled from the engine's own generator, seeded with `seed` (torch's global RNG is left alone).

    A Llama-family model decodes over preallocated KV slots (`slot_cache.py`): with `cuda_graphs` (None: on a GPU)
    each decode step runs at its bucket's static shape, a replayed CUDA graph on a GPU (run eagerly on the CPU),
    compiled first with `compile`; `slot_cache=False` keeps transformers' padded dynamic cache, which other
    architectures use.
    """

    def __init__(
        self,
        model_path: str,
        sampling: SamplingConfig,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int = 4096,
        prefix_cache_tokens: int = 8192,
        seed: int = 0,
        cuda_graphs: bool | None = None,
        compile: bool = False,
        slot_cache: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.sampling = sampling
        self.device = device
        self.generator = torch.Generator(device).manual_seed(seed)  # this engine's own sampling stream
        self.max_model_len = max_model_len
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        if not supports_continuous_batching(self.model):
            raise ValueError(
                f"model {model_path!r} ({self.model.config.model_type}) uses a sliding-window or static KV cache, "
                "which the transformers backend's continuous batching cannot merge; use inference.backend: vllm"
            )
        self.lora = LoRASlots(self.model)
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        self.slot_cache = slot_cache and supports_slot_decoding(self.model)
        self.fused = fuse_projections(self.model) if self.slot_cache else None
        self.cuda_graphs = device.startswith("cuda") if cuda_graphs is None else cuda_graphs
        self.compile = compile
        self._running = self.new_batch()
        self._private: DecodeBatch | None = None  # `generate`'s own batch, made on first use

    @property
    def adapters(self) -> set[str]:
        """The uids of the loaded adapters."""
        return set(self.lora.slot_of)

    def load_adapter(self, checkpoint: Checkpoint) -> None:
        """Load a PEFT LoRA adapter directory under `checkpoint.uid` into a slot of the batched LoRA layers."""
        if checkpoint.uid in self.adapters:
            return
        self.lora.load(checkpoint.uid, checkpoint.path)

    def unload_adapter(self, uid: str) -> None:
        """Free adapter `uid`'s slot and its prefix-cache blocks."""
        if uid in self.adapters:
            self.lora.unload(uid)
            if self.prefix_cache is not None:
                self.prefix_cache.drop_adapter(uid)

    def takes_tensors(self, checkpoint: Checkpoint) -> bool:
        """Adapters and full weights alike are handed over in memory."""
        return True

    def load_adapter_tensors(self, uid: str, config: dict, weights: dict) -> None:
        """Put an adapter handed over in memory (PEFT's config and tensors) into a slot under `uid`."""
        if uid not in self.adapters:
            self.lora.load_tensors(uid, config, weights)

    def load_weights(self, path: str) -> None:
        """Load full fine-tuned weights (a `save_pretrained` directory) into the base model in place."""
        from transformers import AutoModelForCausalLM

        self.load_weight_tensors(AutoModelForCausalLM.from_pretrained(path, dtype=self.model.dtype).state_dict())

    def load_weight_tensors(self, state: dict) -> None:
        """Copy full fine-tuned weights (a state dict of this model's names) into the base model in place, so the
        captured decode steps read them."""
        if self.adapters:
            raise RuntimeError("full-weight sync while LoRA adapters are loaded is not supported")
        self.model.load_state_dict(state)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete a batch of requests (a private running batch: rows join at once and leave as they finish)."""
        batch = self._private = self._private or self.new_batch()
        batch.clear()
        results: dict[int, GenerationResult] = dict(self._admit(batch, list(enumerate(requests))))
        while len(batch):
            results.update(self._results(batch.step()))
        return [results[i] for i in range(len(requests))]

    def __len__(self) -> int:
        """Rows generating in the continuous batch."""
        return len(self._running)

    def adapters_in_use(self) -> set[str]:
        """The adapters the continuous batch's rows use."""
        return self._running.adapters_in_use()

    def add(self, items: list[tuple[Any, GenerationRequest]]) -> list[tuple[Any, GenerationResult]]:
        """Admit `(tag, request)` pairs to the continuous batch; returns those finished already (a prompt too
        long for the context, or a first token that ends the completion)."""
        return self._admit(self._running, items)

    def step(self) -> list[tuple[Any, GenerationResult]]:
        """One decode step of the continuous batch; returns `(tag, result)` of the rows that finished."""
        return self._results(self._running.step())

    def clear(self) -> None:
        """Forget every running row (after a failed step; their callers were told)."""
        self._running.clear()

    def new_batch(self, sampling: SamplingConfig | None = None, eos_token_id: int | None = None) -> DecodeBatch:
        """A running batch of this engine with its own KV cache (and captured steps), sampling by `sampling` and
        ending rows at `eos_token_id` (defaults: the engine's; -1 ends none)."""
        if self.slot_cache:
            graphs = dict(graphs=self.cuda_graphs, compile=self.compile)
            cache = SlotCache(self.model, self.fused, self.device, decoding.ATTENTION_BACKENDS, self.lora, **graphs)
        else:
            cache = PaddedCache(self.model, self.device)
        return DecodeBatch(
            self.model,
            sampling or self.sampling,
            eos_token_id=self.tokenizer.eos_token_id if eos_token_id is None else eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            device=self.device,
            cache=cache,
            prefix_cache=self.prefix_cache,
            lora=self.lora,
            generator=self.generator,
        )

    def _admit(
        self, batch: DecodeBatch, items: list[tuple[Any, GenerationRequest]]
    ) -> list[tuple[Any, GenerationResult]]:
        rows, too_long = [], []
        for tag, request in items:
            ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
            if prompt_fits(ids, self.max_model_len, self.sampling):
                rows.append(Row(tag, ids, self._adapter_name(request), seed=request.seed))
            else:
                too_long.append((tag, prompt_too_long(ids)))
        return too_long + self._results(batch.add(rows))

    def _results(self, rows: list[Row]) -> list[tuple[Any, GenerationResult]]:
        """Each finished row's result (the eos token stays in the ids: the policy must learn to stop)."""
        return [
            (
                row.tag,
                decoded_result(
                    self.tokenizer, row.prompt, row.tokens, row.logprobs, row.finish_reason, self.sampling, row.cached
                ),
            )
            for row in rows
        ]

    def _adapter_name(self, request: GenerationRequest) -> str | None:
        ckpt = request.checkpoint
        if ckpt is None or not ckpt.is_adapter:
            return None
        if ckpt.uid not in self.adapters:
            raise KeyError(f"adapter {ckpt.uid!r} is not loaded; call load_adapter first")
        return ckpt.uid
