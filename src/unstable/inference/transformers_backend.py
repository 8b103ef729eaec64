"""The embedded default backend: transformers `generate` with PEFT multi-adapter batches (CPU friendly)."""

from __future__ import annotations

import warnings

import torch

from unstable.inference.base import (
    GenerationRequest,
    GenerationResult,
    InferenceBackend,
    SamplingConfig,
    decoded_result,
    prompt_fits,
    prompt_too_long,
)
from unstable.records import Checkpoint

BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch


class TransformersBackend(InferenceBackend):
    """Serves a causal LM and any number of LoRA adapters; one `generate` call mixes adapters row by row."""

    def __init__(
        self,
        model_path: str,
        sampling: SamplingConfig,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int = 4096,
        seed: int = 0,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        self.sampling = sampling
        self.device = device
        self.max_model_len = max_model_len
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        self.adapters: set[str] = set()

    def load_adapter(self, checkpoint: Checkpoint) -> None:
        """Load a PEFT adapter directory under `checkpoint.uid` (the first one wraps the model in PeftModel)."""
        from peft import PeftModel

        if checkpoint.uid in self.adapters:
            return
        if not self.adapters and not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, checkpoint.path, adapter_name=checkpoint.uid)
        else:
            self.model.load_adapter(checkpoint.path, adapter_name=checkpoint.uid)
        self.model.eval()
        self.adapters.add(checkpoint.uid)

    def unload_adapter(self, uid: str) -> None:
        """Delete adapter `uid`; the PeftModel wrapper stays (a batch may still name other adapters)."""
        if uid in self.adapters:
            with warnings.catch_warnings():  # PEFT warns when the "active" adapter goes; batches name theirs
                warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
                self.model.delete_adapter(uid)
            self.adapters.discard(uid)

    def load_weights(self, path: str) -> None:
        """Load full fine-tuned weights (a `save_pretrained` directory) into the base model in place."""
        from transformers import AutoModelForCausalLM

        if self.adapters:
            raise RuntimeError("full-weight sync while LoRA adapters are loaded is not supported")
        new_state = AutoModelForCausalLM.from_pretrained(path, dtype=self.model.dtype).state_dict()
        self.model.load_state_dict(new_state)

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Sample completions for a batch, returning tokens and their log-probs under the sampling policy."""
        encoded = [self.tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in requests]
        fits = [prompt_fits(ids, self.max_model_len, self.sampling) for ids in encoded]
        results: list[GenerationResult | None] = [
            None if ok else prompt_too_long(ids) for ids, ok in zip(encoded, fits)
        ]
        rows = [i for i, ok in enumerate(fits) if ok]
        if rows:
            batch = [encoded[i] for i in rows]
            adapters = [self._adapter_name(requests[i]) for i in rows]
            for i, result in zip(rows, self._generate_rows(batch, adapters)):
                results[i] = result
        return results  # type: ignore[return-value]

    def _adapter_name(self, request: GenerationRequest) -> str:
        ckpt = request.checkpoint
        if ckpt is None or not ckpt.is_adapter:
            return BASE_ADAPTER
        if ckpt.uid not in self.adapters:
            raise KeyError(f"adapter {ckpt.uid!r} is not loaded; call load_adapter first")
        return ckpt.uid

    def _generate_rows(self, prompts: list[list[int]], adapters: list[str]) -> list[GenerationResult]:
        padded = self.tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(self.device)
        greedy = self.sampling.temperature == 0
        extra = {"adapter_names": adapters} if self.adapters else {}
        out = self.model.generate(
            **padded,
            do_sample=not greedy,
            temperature=None if greedy else self.sampling.temperature,
            top_p=None if greedy else self.sampling.top_p,
            top_k=0,
            max_new_tokens=self.sampling.max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            **extra,
        )
        prompt_len = padded["input_ids"].shape[1]
        new_tokens = out.sequences[:, prompt_len:]  # (B, T)
        logits = torch.stack(out.logits, dim=1).float()  # (B, T, V)
        temperature = 1.0 if greedy else self.sampling.temperature
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        token_logprobs = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
        return [self._row_result(p, t, lp) for p, t, lp in zip(prompts, new_tokens.tolist(), token_logprobs.tolist())]

    def _row_result(self, prompt: list[int], tokens: list[int], logprobs: list[float]) -> GenerationResult:
        eos = self.tokenizer.eos_token_id
        finish = "length"
        if eos in tokens:
            end = tokens.index(eos) + 1  # keep the eos token: the policy must learn to stop
            tokens, logprobs, finish = tokens[:end], logprobs[:end], "stop"
        return decoded_result(self.tokenizer, prompt, tokens, logprobs, finish)
