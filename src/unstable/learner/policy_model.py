"""The policy model: a causal LM loaded for training (a LoRA adapter or every weight), its token log-probs under
the distribution each step was sampled from, the reference policy (the run's starting policy) and atomic
checkpoints the inference engines load.

Precision: trainable weights and their optimizer state are float32 (master weights; a bf16 weight rounds an
AdamW step of 1e-5 away) and a bfloat16 model computes its forward passes in bf16 under autocast. Frozen weights
stay in the model dtype: the base under a LoRA adapter (PEFT keeps the adapter in float32). A float16 model trains
in float32 throughout: the learner does no loss scaling, without which float16 gradients underflow.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from unstable import atomic
from unstable.algorithms.batching import (
    SharedPrompts,
    TokenBatch,
    completion_totals,
    decision_positions,
    micro_batches,
    share_prompts,
)
from unstable.algorithms.trainable import PolicyOutput
from unstable.inference.decoding import top_p_nucleus
from unstable.learner.config import PolicyConfig
from unstable.learner.parallel import assign, whole_copy
from unstable.records import Step

# A chunk's top-p nuclei are sorted in this many parts: the probabilities, the sort's values and int64 indices and
# the running sums cost about 6x the rows' float32 logits, so each part's temporaries stay below the chunk's logits.
NUCLEUS_SORT_PARTS = 8


class PolicyModel:
    """`model_path` with LoRA (`cfg.lora`) or fully trainable (`cfg.lora is None`), on `device`; `load` sets torch
    to `num_threads` threads (None: torch's choice).

    Each row is scored under the sampling settings its step carries (`TokenBatch.temperature`, `.top_p`), so
    `forward`'s log-probs and the recorded behaviour log-probs come from the same distribution. Nothing heavy
    happens before `load()`.
    """

    def __init__(
        self,
        model_path: str,
        cfg: PolicyConfig,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        num_threads: int | None = None,
    ):
        self.model_path = model_path
        self.cfg = cfg
        self.dtype = dtype
        self.device = device
        self.num_threads = num_threads
        self.model = None
        self.scoring = None  # `model` under a module whose forward is `forward`'s pass (see `ScoringPass`)
        self.tokenizer = None
        self._reference = None  # frozen full model for `reference_logprobs` (full fine-tuning only)
        self._reference_adapter = None  # frozen adapter weights of the LoRA reference (the initial adapter or moved)
        self._reference_moved = False  # whether `move_reference` moved the reference off the starting policy
        self._adapter_parameters = (None, [])  # (the model, its LoRA parameters by served name): `_adapter_tensors`

    def load(self, on_device: bool = True) -> None:
        """Load the tokenizer and model, wrap LoRA, move to the device (`on_device` False: left on the host for FSDP,
        which moves each shard there as it shards the model, so no device holds it whole). Idempotent."""
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self._weights_dtype())
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = self._wrap_lora(model)
        if on_device:
            self.model.to(self.device)
        self.scoring = ScoringPass(self.model)
        self.model.train()
        if self.cfg.initial_lora_path:  # copied before any update or resume overwrites the adapter
            frozen = self.trainable_state().items()
            self._reference_adapter = {name: torch.nn.Parameter(w, requires_grad=False) for name, w in frozen}

    def _weights_dtype(self) -> torch.dtype:
        """The dtype the model is loaded in: float32 when every weight trains (the master weights) or the model is
        float16 (no loss scaling: see the module docstring), else the model dtype (a frozen LoRA base)."""
        if self.cfg.lora is None or self.dtype == "float16":
            return torch.float32
        return getattr(torch, self.dtype)

    def _wrap_lora(self, model):
        lora = self.cfg.lora
        if lora is None:
            return model
        from peft import LoraConfig, PeftModel, get_peft_model

        if self.cfg.initial_lora_path:
            return PeftModel.from_pretrained(model, self.cfg.initial_lora_path, is_trainable=True)
        peft_cfg = LoraConfig(
            r=lora.lora_rank,
            lora_alpha=lora.lora_alpha,
            lora_dropout=lora.lora_dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, peft_cfg)

    @property
    def hidden_size(self) -> int:
        """Width of the decision-state encodings."""
        return self.model.config.hidden_size

    @property
    def pad_id(self) -> int:
        """The id that pads sequences (the tokenizer's pad token, else 0)."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The weights an optimizer updates: LoRA weights, or every weight when fully fine-tuning."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def micro_batches(self, steps: list[Step], min_count: int = 0) -> list[TokenBatch]:
        """Token-budget micro-batches of `steps` on the device, at least `min_count` of them; `TokenBatch.rows`
        index into `steps`."""
        cfg = self.cfg
        return micro_batches(
            steps,
            self.pad_id,
            cfg.micro_batch_tokens,
            max_rows=cfg.mini_batch_size,
            max_train_len=cfg.max_train_len,
            min_count=min_count,
            device=self.device,
        )

    def forward(self, batch: TokenBatch, *, encodings: bool = False, entropy: bool = False) -> PolicyOutput:
        """See `_forward`: this policy's token log-probs (and encodings or entropies on request)."""
        return self.scoring(self._forward, self.model, batch, encodings=encodings, entropy=entropy)

    @torch.no_grad()
    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Token log-probs of `batch` under the reference policy, `(B, L-1)`: the run's starting policy until
        `move_reference` moves it toward the weights of that moment.

        With LoRA: the base model plus the reference adapter (`cfg.initial_lora_path` copied when loaded, so a
        resumed run keeps it as its reference, or the adapter `move_reference` moved), or with neither the base
        model with the adapter disabled. Fully fine-tuned: a frozen second model, the weights at `model_path` (the
        warm start of such a run) loaded once more on first use, in the trainable weights' dtype so that it equals
        the policy at the start.
        """
        if self._reference_adapter is not None:
            with _parameters_replaced(self.model, self._reference_adapter):
                return self._forward(self.model, batch).logprobs
        if self.cfg.lora is not None:
            with self.model.disable_adapter():
                return self._forward(self.model, batch).logprobs
        return self._forward(self._reference_model(), batch).logprobs

    def _reference_model(self) -> torch.nn.Module:
        """The frozen full model `reference_logprobs` scores with, loaded from `model_path` on first use."""
        if self._reference is None:
            from transformers import AutoModelForCausalLM

            reference = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self._weights_dtype())
            self._reference = reference.to(self.device).eval().requires_grad_(False)
        return self._reference

    @torch.no_grad()
    def move_reference(self, fraction: float = 1.0) -> None:
        """Move the reference policy `fraction` of the way to the current trainable weights, weight by weight (1:
        make them the reference; a moving KL anchor). With LoRA the adapter's A and B move each, so a fraction
        under 1 moves the reference's weight change B @ A only about that far; a reference that is still the base
        model (no initial adapter) starts as the current adapter with its B zero, which is the base model."""
        if self.cfg.lora is not None and self._reference_adapter is None:
            self._reference_adapter = {
                name: torch.nn.Parameter(torch.zeros_like(w) if _is_lora_b(name) else w.clone(), requires_grad=False)
                for name, w in self.trainable_state().items()
            }
        reference = self._reference_weights()
        for name, weight in self.model.named_parameters():
            if name not in reference:
                continue
            if fraction < 1:
                reference[name].lerp_(weight, fraction)
            else:
                reference[name].copy_(weight)
        self._reference_moved = True

    def _reference_weights(self) -> dict[str, torch.Tensor]:
        """The reference's counterparts of the trainable weights, by name (the tensors themselves, not copies)."""
        if self.cfg.lora is not None:
            return self._reference_adapter
        weights = dict(self._reference_model().named_parameters())
        return {name: weights[name] for name, _ in self.model.named_parameters()}

    def reference_state(self) -> dict[str, torch.Tensor] | None:
        """CPU copies of the reference's trainable weights once `move_reference` moved it, for resume; None while it
        is the starting policy (which loading rebuilds)."""
        if not self._reference_moved:
            return None
        return {name: w.detach().cpu().clone() for name, w in self._reference_weights().items()}

    @torch.no_grad()
    def load_reference_state(self, state: dict[str, torch.Tensor] | None) -> None:
        """Make `state` (trainable weights by name, from `trainable_state` or `reference_state`) the reference;
        None leaves the starting policy as it is."""
        if state is None:
            return
        if self.cfg.lora is not None:
            self._reference_adapter = {
                name: torch.nn.Parameter(w.detach().clone().to(self.device), requires_grad=False)
                for name, w in state.items()
            }
        else:
            self._reference_model().load_state_dict(state, strict=False)
        self._reference_moved = True

    def _forward(self, model, batch: TokenBatch, *, encodings: bool = False, entropy: bool = False) -> PolicyOutput:
        """Token log-probs at the completion targets (0 elsewhere), each under its row's sampling distribution
        (`_token_scores`), plus decision-state encodings or entropies on request.

        The output layer runs only on the hidden states of completion targets, `cfg.logit_chunk_tokens` rows at
        a time, so no `(B, L, vocab)` tensor (let alone a float32 one) is ever built: prompts are most of every
        sequence and their logits are never needed.
        """
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        rows, cols = batch.completion_mask.nonzero(as_tuple=True)  # completion targets: position t predicts t+1
        targets = batch.input_ids[rows, cols + 1]  # (N,)
        head = causal_lm.get_output_embeddings()
        with self._autocast():  # the output layer too: in float32 it was a third of a bf16 update on a GPU
            hidden = self._hidden_states(causal_lm.get_decoder(), batch)  # (B, L, H)
            token_logp, token_entropy = self._token_scores(
                head, hidden[rows, cols], targets, batch.temperature[rows], batch.top_p[rows], entropy
            )
        logprobs = torch.zeros(batch.completion_mask.shape, device=hidden.device)  # (B, L-1)
        result = PolicyOutput(logprobs.index_put((rows, cols), token_logp))
        if encodings:
            positions = torch.arange(hidden.shape[0], device=hidden.device)  # (B,)
            result.encodings = hidden[positions, decision_positions(batch)].float()  # (B, H)
        if entropy:
            result.entropy = torch.zeros_like(logprobs).index_put((rows, cols), token_entropy)  # (B, L-1)
        return result

    def _autocast(self):
        """Mixed precision for the forward pass in `cfg.autocast_dtype`, else in the model dtype when it is bfloat16
        (float32 master weights, bf16 compute), else a no-op context."""
        name = self.cfg.autocast_dtype or (self.dtype if self.dtype == "bfloat16" else None)
        dtype = getattr(torch, name) if name else None
        return torch.autocast(device_type=self.device, dtype=dtype, enabled=dtype is not None)

    def _hidden_states(self, decoder: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """The decoder's last hidden states `(B, L, H)` in `cfg.layout`: 'padded' whole rows; 'packed' the real
        tokens packed into one row (no attention mask, position ids restarting per sequence), scattered back;
        'shared-prompts' exact from each row's decision position on, zeros before it (`_shared_prompt_states`), or
        'padded' where gradient checkpointing would drop the keys and values it hands on, or FSDP's layers, run
        more than once before the backward pass, would have freed their gathered weights."""
        from torch.distributed.fsdp import FSDPModule

        layers = getattr(decoder, "layers", None)  # FSDP shards a decoder's `layers` (`DataParallel.shard_model`)
        sharded = layers is not None and isinstance(layers[0], FSDPModule)
        sharing = self.cfg.layout == "shared-prompts" and not (self.cfg.gradient_checkpointing or sharded)
        if sharing and (shared := share_prompts(batch)) is not None:
            return _shared_prompt_states(decoder, shared, batch.input_ids.shape[1])
        if self.cfg.layout != "packed":  # no KV cache: a training forward never decodes further
            return decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)[0]
        real = batch.attention_mask.bool()  # (B, L)
        positions = batch.attention_mask.cumsum(-1) - 1  # (B, L): 0, 1, ... along each sequence's own tokens
        packed = decoder(input_ids=batch.input_ids[real][None], position_ids=positions[real][None], use_cache=False)
        states = packed.last_hidden_state[0]  # (T, H): the real tokens of every row, one after another
        return states.new_zeros(*real.shape, states.shape[-1]).index_put(real.nonzero(as_tuple=True), states)

    def _token_scores(
        self,
        head: torch.nn.Module,
        states: torch.Tensor,
        targets: torch.Tensor,
        temperature: torch.Tensor,
        top_p: torch.Tensor,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each target's log-prob under the distribution it was sampled from and, with `entropy`, the entropy of
        the full tempered distribution (else zeros); `(N,)` each, float32, for `states` (N, H) with their
        `targets`, `temperature` and `top_p` (N,).

        With `p = softmax(head(state) / temperature)`, a target t scores `log p(t) - log sum_{v in S} p(v)`, S the
        top-p nucleus of p plus t (the whole vocabulary when `top_p == 1`). With the sampler's weights that is
        the engine's recorded log-prob; t stays in S when it has left the current nucleus, so its log-prob and
        gradient stay finite, and S is chosen without gradient. The output layer runs `cfg.logit_chunk_tokens`
        rows at a time.
        """
        logps, entropies = [], []
        for start in range(0, states.shape[0], self.cfg.logit_chunk_tokens):
            chunk = slice(start, start + self.cfg.logit_chunk_tokens)
            logits = head(states[chunk]).float() / temperature[chunk, None]  # (n, V)
            support = _sampled_support(logits, targets[chunk], top_p[chunk])  # (n, V) bool, or None: every token
            log_mass = torch.logsumexp(logits if support is None else logits.masked_fill(~support, -torch.inf), -1)
            logps.append(logits.gather(-1, targets[chunk, None]).squeeze(-1) - log_mass)  # (n,)
            if entropy:
                log_z = log_mass if support is None else torch.logsumexp(logits, -1)  # (n,)
                entropies.append(log_z - (torch.softmax(logits, -1) * logits).sum(-1))  # (n,) log Z - E_p[logit]
            else:
                entropies.append(torch.zeros_like(log_mass))
        empty = states.new_zeros(0, dtype=torch.float32)
        return (torch.cat(logps), torch.cat(entropies)) if logps else (empty, empty)

    def completion_logprobs(self, steps: list[Step]) -> list[float]:
        """Each step's completion log-probability (summed over its tokens) under the model at the step's sampling
        settings, in input order."""
        return completion_totals(self.micro_batches(steps), lambda batch: self.forward(batch).logprobs, len(steps))

    def save(self, directory: str | os.PathLike, weights: dict[str, torch.Tensor] | None = None) -> str:
        """Write the adapter (float32, as trained) or the whole model in the model dtype with its tokenizer to
        `directory` atomically; return it. The resume state, not this checkpoint, keeps the float32 masters. A full
        model's `weights` (a state dict; default the model's own) are what is written: a sharded model's gathered
        whole."""
        return self.write_served(directory, self.served_weights("cpu", weights))

    def served_weights(
        self, device: str | None = None, weights: dict[str, torch.Tensor] | None = None
    ) -> tuple[dict | None, dict[str, torch.Tensor]]:
        """A copy of what an engine serves of the current policy, on `device` (default the learner's): a LoRA
        adapter's PEFT config (as `adapter_config.json` holds it) and tensors (as `adapter_model.safetensors`), or None
        and every weight cast to the model dtype (a full model's `weights`, default its own). Copies: the next update
        leaves them as they are, so they can be handed over or written while it runs."""
        device = device or self.device
        if self.cfg.lora is None:
            return None, self._served_state(weights or self.model.state_dict(), device)
        from peft import get_peft_model_state_dict

        config = self.model.peft_config["default"].to_dict() | {"inference_mode": True}  # as PEFT saves it
        config = {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}
        tensors = self._adapter_tensors() or get_peft_model_state_dict(self.model).items()
        return config, {name: w.detach().to(device, copy=True).contiguous() for name, w in tensors}

    def _adapter_tensors(self) -> list[tuple[str, torch.Tensor]] | None:
        """The adapter's parameters under the names PEFT saves them with, found once (PEFT's state dict walks the
        whole model: most of a 0.055 s handover on an H200); None where a saved tensor is not a parameter."""
        if self._adapter_parameters[0] is not self.model:
            from peft import get_peft_model_state_dict

            by_address = {p.data_ptr(): p for p in self.model.parameters()}
            found = [(name, by_address.get(w.data_ptr())) for name, w in get_peft_model_state_dict(self.model).items()]
            self._adapter_parameters = (self.model, found if all(p is not None for _, p in found) else [])
        return self._adapter_parameters[1] or None

    def _served_state(self, weights: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        """Copies of `weights` cast to the model dtype on `device`; tied weights stay one tensor."""
        dtype = getattr(torch, self.dtype)
        cast: dict[int, torch.Tensor] = {}  # by address
        state = {}
        for name, weight in weights.items():
            if weight.data_ptr() not in cast:
                to = dict(dtype=dtype) if weight.is_floating_point() else {}
                cast[weight.data_ptr()] = weight.detach().to(device, copy=True, **to)
            state[name] = cast[weight.data_ptr()]
        return state

    def write_served(self, directory: str | os.PathLike, served: tuple[dict | None, dict[str, torch.Tensor]]) -> str:
        """Write `served` (from `served_weights`) as a checkpoint folder at `directory`, atomically; return it. It
        reads nothing an update changes, so it may run on another thread during the next update."""
        from safetensors.torch import save_file

        config, tensors = served
        final = Path(directory)
        with atomic.replace_dir(final) as tmp:  # a re-run into the same directory replaces the old checkpoint
            if config is None:
                self.model.save_pretrained(tmp, state_dict=tensors)
                self.model.config.dtype = self.dtype  # save_pretrained wrote the masters' float32
                self.model.config.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
            else:
                (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
                save_file({k: v.cpu() for k, v in tensors.items()}, tmp / "adapter_model.safetensors", {"format": "pt"})
        return str(final)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the whole trainable weights by name (what an update changes); a sharded model's gathered onto
        the CPU from every rank, which call it together."""
        return {name: whole_copy(p.detach()) for name, p in self.model.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite the trainable weights with `state` (from `trainable_state`); names must match exactly."""
        params = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        if set(params) != set(state):
            missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise ValueError(f"trainable weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
        with torch.no_grad():
            for name, value in state.items():
                assign(params[name], value)


def _shared_prompt_states(decoder: torch.nn.Module, shared: SharedPrompts, length: int) -> torch.Tensor:
    """Hidden states `(B, length, H)` of a micro-batch cut by `share_prompts`: each level of the prompt tree runs
    once, attending to the keys and values of its nodes' ancestors (the cache's rows picked by parent); then each
    row's suffix, attending to its prompt's. Exact (the same attention over the same keys, at the same positions)
    where the log-probs and encodings read them, from each row's decision position on; zeros before it.
    Gradients flow back through the picked rows, so each shared token's backward pass also runs once."""
    cache, seen = None, None  # seen: (nodes, tokens so far) 1 where a cached key is a real token
    for level in shared.levels:
        if cache is not None:
            cache.batch_select_indices(level.parent)
            seen = seen[level.parent]
        seen = level.mask if seen is None else torch.cat([seen, level.mask], 1)
        if level.ids.shape[1]:
            positions = level.offsets[:, None] + torch.arange(level.ids.shape[1], device=level.ids.device)
            cache = decoder(
                input_ids=level.ids, attention_mask=seen, position_ids=positions, past_key_values=cache, use_cache=True
            ).past_key_values
    cache.batch_select_indices(shared.leaf)
    rows, width = shared.suffix_ids.shape
    positions = shared.starts[:, None] + torch.arange(width, device=shared.starts.device)  # (B, S)
    states = decoder(
        input_ids=shared.suffix_ids,
        attention_mask=torch.cat([seen[shared.leaf], shared.suffix_mask], 1),
        position_ids=positions,
        past_key_values=cache,
        use_cache=False,
    )[0]  # (B, S, H)
    real_rows, real_cols = shared.suffix_mask.nonzero(as_tuple=True)
    where = (real_rows, shared.starts[real_rows] + real_cols)
    return states.new_zeros(rows, length, states.shape[-1]).index_put(where, states[real_rows, real_cols])


class ScoringPass(torch.nn.Module):
    """`causal_lm` as the child of a module whose forward is the policy model's pass over it (the decoder, then the
    output layer on chosen rows, never `causal_lm.forward`). Sharded with FSDP2, this module is the root unit whose
    hooks gather and free the weights outside the decoder layers around that pass; unsharded it only calls it."""

    def __init__(self, causal_lm: torch.nn.Module):
        super().__init__()
        self.causal_lm = causal_lm

    def forward(self, run, *args, **kwargs):
        """`run(*args, **kwargs)`; a sharded root then frees its gathered weights if no backward pass will."""
        result = run(*args, **kwargs)
        if not torch.is_grad_enabled() and hasattr(self, "reshard"):  # FSDP keeps the root's weights for backward
            self.reshard()
        return result


@torch.no_grad()
def _sampled_support(logits: torch.Tensor, targets: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor | None:
    """The tokens each row's log-prob is normalised over, `(n, V)` bool: the top-p nucleus of `softmax(logits)`
    (`inference.decoding.top_p_nucleus`, the engine's rule) plus the row's target; None when no row is truncated.
    Sorted `NUCLEUS_SORT_PARTS` parts at a time (see there)."""
    if bool((top_p >= 1).all()):
        return None
    support = torch.empty(logits.shape, dtype=torch.bool, device=logits.device)  # (n, V)
    rows = math.ceil(logits.shape[0] / NUCLEUS_SORT_PARTS)
    for start in range(0, logits.shape[0], rows):
        part = slice(start, start + rows)
        support[part] = top_p_nucleus(torch.softmax(logits[part], -1), top_p[part])
    return support.scatter_(-1, targets[:, None], True)


@contextmanager
def _parameters_replaced(model: torch.nn.Module, values: dict[str, torch.nn.Parameter]) -> Iterator[None]:
    """`model` with the parameters named in `values` swapped for them until exit. The swapped-out parameters are
    not written to (unlike an in-place copy), so a graph that saved them for its backward pass stays valid."""
    originals = {name: model.get_parameter(name) for name in values}
    try:
        for name, value in values.items():
            _set_parameter(model, name, value)
        yield
    finally:
        for name, value in originals.items():
            _set_parameter(model, name, value)


def _set_parameter(model: torch.nn.Module, name: str, value: torch.nn.Parameter) -> None:
    module, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(module), attribute, value)


def _is_lora_b(name: str) -> bool:
    """Whether the adapter weight `name` is a LoRA B matrix (zero B: the adapter changes nothing)."""
    return "lora_B." in name or "lora_embedding_B." in name
