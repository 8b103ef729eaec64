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
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        padded = self.tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(self.device)
        greedy = self.sampling.temperature == 0
        recorder = SampledTokenLogprobs(1.0 if greedy else self.sampling.temperature)
        processors = [recorder]  # sees the raw logits; the warpers below shape only what is sampled
        if not greedy:
            processors += [TemperatureLogitsWarper(self.sampling.temperature), TopPLogitsWarper(self.sampling.top_p)]
        extra = {"adapter_names": adapters} if self.adapters else {}
        out = self.model.generate(
            **padded,
            do_sample=not greedy,
            temperature=1.0,  # neutral values override the model's generation_config: only our warpers shape it
            top_p=1.0,
            top_k=0,
            max_new_tokens=self.sampling.max_new_tokens,
            logits_processor=LogitsProcessorList(processors),
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            **extra,
        )
        new_tokens = out.sequences[:, padded["input_ids"].shape[1] :]  # (B, T)
        token_logprobs = recorder.finish(new_tokens[:, -1])  # (B, T)
        return [self._row_result(p, t, lp) for p, t, lp in zip(prompts, new_tokens.tolist(), token_logprobs.tolist())]

    def _row_result(self, prompt: list[int], tokens: list[int], logprobs: list[float]) -> GenerationResult:
        eos = self.tokenizer.eos_token_id
        finish = "length"
        if eos in tokens:
            end = tokens.index(eos) + 1  # keep the eos token: the policy must learn to stop
            tokens, logprobs, finish = tokens[:end], logprobs[:end], "stop"
        return decoded_result(self.tokenizer, prompt, tokens, logprobs, finish)


class SampledTokenLogprobs:
    """A logits processor that records `log softmax(logits / temperature)[token]` of each sampled token.

    At step t it sees step t's raw logits and, as the last input id, the token sampled at step t-1; it keeps one
    step's `(B, V)` log-probs, never all of them (`output_logits` would hold `(B, T, V)`). `finish(last_tokens)`
    adds the last step's token and returns the `(B, T)` log-probs.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-probs of the step before
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.logprobs.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))  # (B,)
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)  # (B, V)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """The log-probs of every generated token, `(B, T)`."""
        self.logprobs.append(self.previous.gather(-1, last_tokens[:, None]).squeeze(-1))
        return torch.stack(self.logprobs, dim=1)  # (B, T)
