"""Continuous batching for a transformers causal LM: rows join and leave a running batch between decode steps.

A `DecodeBatch` holds the rows being generated, their KV cache and each row's next token. `add` has the cache prefill
new prompts in one forward pass (over what the prefix cache does not hold); `step` runs one decode forward over every
row, samples a token per row (recording its log-prob under the distribution it was drawn from, tempered and top-p
truncated, computed from one step's logits only) and returns the rows that finished, which leave the batch at once so a
waiting request can take their place. Only the last position's logits are computed (`logits_to_keep=1`), never `(tokens,
vocab)` for a whole prompt.

The cache is a `slot_cache.SlotCache` (preallocated slots, the prefill and the decode step the engine's own pass, the
decode step a CUDA graph on a GPU) for Llama-family models, else a `PaddedCache` (transformers' dynamic cache and
forward pass, left-padded to one length). Rows may name different LoRA adapters: the batched LoRA layers
(`inference/lora.py`) apply each row's adapter in the same forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from unstable.inference.base import SamplingConfig
from unstable.inference.lora import LoRASlots
from unstable.inference.prefix_cache import BLOCK, BlockKV, LayerKV, PrefixCache
from unstable.records import mixed_seed

# The attention kernels a decode forward may use. Not cuDNN's: it builds an execution plan for each new shape, and a
# decode step's key length is new at every step (on an H100, `experiments/decode_profile.py`: 1.5-3x slower steps).
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class Row:
    """One request being generated: its prompt, what it has produced so far and who is waiting for it."""

    tag: Any
    prompt: list[int]
    adapter: str | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    cached: int = 0  # prompt tokens taken from the prefix cache
    seed: int | None = None  # the request's sampling seed (None: the engine's stream)


def sample_tokens(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    row_keys: list[int | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` (B, V); returns the tokens (B,) and their log-probs (B,) under the
    distribution they were drawn from: `softmax(logits / temperature)` cut to its `top_p` nucleus and
    renormalised, as vLLM's processed log-probs (greedy: the untruncated temperature-1 log-probs). A row with a key
    in `row_keys` (`row_key`) draws by the Gumbel-max rule from noise that is a function of its key alone; the
    others from `generator`."""
    logits = logits.float()
    if sampling.temperature == 0:
        tokens = logits.argmax(-1)  # (B,)
        logprobs = torch.log_softmax(logits, -1)  # (B, V)
    else:
        logits = logits / sampling.temperature
        if sampling.top_p < 1.0:
            logits = logits.masked_fill(~top_p_nucleus(torch.softmax(logits, -1), sampling.top_p), -torch.inf)
        logprobs = torch.log_softmax(logits, -1)  # (B, V), -inf outside the nucleus
        keyed = [i for i, key in enumerate(row_keys or ()) if key is not None]
        if not keyed:  # training's rows: one draw from the generator, as every decode step makes
            tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)  # (B,)
        else:
            tokens = torch.empty(len(logits), dtype=torch.long, device=logits.device)  # (B,)
            free = [i for i, key in enumerate(row_keys) if key is None]
            if free:
                tokens[free] = torch.multinomial(logprobs[free].exp(), 1, generator=generator).squeeze(-1)
            noise = keyed_gumbel([row_keys[i] for i in keyed], logits.shape[-1], logits.device)  # (K, V)
            tokens[keyed] = (logprobs[keyed].double() + noise).argmax(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


MASK31 = (1 << 31) - 1


def row_key(seed: int, step: int) -> int:
    """The noise key of a seeded request's token number `step`: 31 bits of `seed` and `step` mixed."""
    return mixed_seed(seed, step) & MASK31


def _mix31(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash of each element of `x` (int64, each in [0, 2^31)); no product leaves int64."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & MASK31
    return x ^ (x >> 16)


def keyed_gumbel(keys: list[int], vocab: int, device) -> torch.Tensor:
    """Standard Gumbel noise (K, V), float64, each row a function of its key (`row_key`) alone: added to a row's
    log-probs, its argmax is a draw from their distribution (the Gumbel-max rule), whatever rows run beside it."""
    key = torch.tensor(keys, dtype=torch.long, device=device)[:, None]  # (K, 1)
    token = torch.arange(vocab, dtype=torch.long, device=device)[None, :]  # (1, V)
    bits = _mix31(_mix31(key) ^ _mix31(token))  # (K, V)
    uniform = (bits.double() + 0.5) / (1 << 31)  # in (0, 1)
    return -torch.log(-torch.log(uniform))


def top_p_nucleus(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """The top-p nucleus of each row of `probs` (B, V) as a bool mask (B, V): the smallest set of most likely
    tokens whose mass reaches `top_p` (a float, or one per row (B,)), i.e. every token the tokens ranked above it
    leave below `top_p`; the top token always stays. Rows with `top_p >= 1` keep every token. vLLM cuts by the
    same rule, and the learner scores with it (`PolicyModel`)."""
    top_p = torch.as_tensor(top_p, dtype=probs.dtype, device=probs.device).reshape(-1, 1)  # (B, 1) or (1, 1)
    ranked, order = probs.sort(-1, descending=True)  # (B, V)
    inside = (ranked.cumsum(-1) - ranked < top_p) | (top_p >= 1)  # (B, V), in rank order
    return torch.zeros_like(inside).scatter(-1, order, inside)


class DecodeBatch:
    """The running batch of a continuously batching engine (see the module docstring); its KV cache is `cache`, a
    `PaddedCache` or a `slot_cache.SlotCache`."""

    def __init__(
        self,
        model,
        sampling: SamplingConfig,
        *,
        eos_token_id: int,
        pad_token_id: int,
        device: str,
        cache=None,
        prefix_cache: PrefixCache | None = None,
        lora: LoRASlots | None = None,
        generator: torch.Generator | None = None,
    ):
        self.model = model
        self.generator = generator  # the engine's sampling stream (None: torch's global one)
        self.prefix_cache = prefix_cache
        self.lora = lora
        self.sampling = sampling
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.device = device
        self.cache = cache if cache is not None else PaddedCache(model, device)
        self.clear()

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        """Forget every row (after a failed step; their callers were told)."""
        self.rows: list[Row] = []
        self.next_tokens = torch.zeros(0, dtype=torch.long, device=self.device)  # (B,) sampled, not yet cached
        self.cache.clear()

    def adapters_in_use(self) -> set[str]:
        """The adapters the running rows use."""
        return {row.adapter for row in self.rows if row.adapter is not None}

    @torch.no_grad()
    def add(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows` (one forward pass over what the prefix cache does not hold), sample each one's first token
        and join the batch; returns the rows already finished by that token."""
        if not rows:
            return []
        cached = [self.prefix_cache.lookup(r.prompt, r.adapter) if self.prefix_cache else [] for r in rows]
        skip = [BLOCK * len(blocks) for blocks in cached]  # prompt tokens each row takes from the cache
        for row, n in zip(rows, skip):
            row.cached = n
        fresh = [r.prompt[n:] for r, n in zip(rows, skip)]
        if self.lora is not None:
            self.lora.select([r.adapter for r in rows])
        max_length = max(len(r.prompt) for r in rows) + self.sampling.max_new_tokens
        logits, fresh_kv = self.cache.prefill(fresh, cached, max_length, self.pad_token_id)  # (N, V)
        if self.prefix_cache is not None:
            for i, (row, n) in enumerate(zip(rows, skip)):
                self.prefix_cache.store(row.prompt, row.adapter, n // BLOCK, fresh_kv(i))
        self.rows += rows
        return self._record(logits, first_new_row=len(self.rows) - len(rows))

    @torch.no_grad()
    def step(self) -> list[Row]:
        """One decode step for every row; returns (and removes) the rows that finished."""
        if not self.rows:
            return []
        if self.lora is not None:
            self.lora.select([row.adapter for row in self.rows])
        return self._record(self.cache.decode(self.next_tokens), first_new_row=0)

    def _record(self, logits: torch.Tensor, first_new_row: int) -> list[Row]:
        """Sample the next token of rows `first_new_row:` from their logits, append it, drop finished rows."""
        new_rows = self.rows[first_new_row:]
        keys = [None if row.seed is None else row_key(row.seed, len(row.tokens)) for row in new_rows]
        tokens, logprobs = sample_tokens(logits, self.sampling, self.generator, keys)  # (N,), (N,)
        for row, token, logprob in zip(new_rows, tokens.tolist(), logprobs.tolist()):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token == self.eos_token_id:
                row.finish_reason = "stop"
            elif len(row.tokens) >= self.sampling.max_new_tokens:
                row.finish_reason = "length"
        self.next_tokens = torch.cat([self.next_tokens[:first_new_row], tokens])  # (B,)
        return self._drop_finished()

    def _drop_finished(self) -> list[Row]:
        finished = [i for i, row in enumerate(self.rows) if row.finish_reason]
        if not finished:
            return []
        done = [self.rows[i] for i in finished]
        order = self.cache.remove(finished)
        self.rows = [self.rows[i] for i in order]
        self.next_tokens = self.next_tokens[torch.tensor(order, dtype=torch.long, device=self.device)]
        return done


def model_forward(model, ids, mask, positions, cache) -> torch.Tensor:
    """The model's forward pass over `ids` (B, T) into `cache`; the last position's logits (B, V)."""
    with sdpa_kernel(ATTENTION_BACKENDS):
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1]  # (B, V)


class PaddedCache:
    """The running batch's KV cache as transformers' DynamicCache, left-padded to one length: any architecture whose
    cache is plain per-layer keys and values (`supports_continuous_batching`). Joining rows are padded to the
    longest, every decode step appends a column to every row, and columns no remaining row attends to are trimmed."""

    def __init__(self, model, device: str):
        self.model = model
        self.device = device
        self.clear()

    def __len__(self) -> int:
        return len(self.positions)

    def clear(self) -> None:
        """Hold no row."""
        self.cache = None  # a DynamicCache whose layers hold (B, heads, L, head_dim) keys and values
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # (B, L): 1 where a token is cached
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)  # (B,) position of each next token

    def prefill(self, fresh: list[list[int]], cached: list[list[BlockKV]], max_length: int, pad_token_id: int):
        """Add rows: row i's cached prefix (`cached[i]`, prefix-cache blocks) and its `fresh` tokens run through the
        model's own forward pass, left-padded into one batch. Returns the rows' last-token logits `(N, V)` and a
        function giving row i's fresh keys and values (per layer, `(heads, len(fresh[i]), head_dim)` each).
        `max_length`, the room the rows need, is for caches that preallocate."""
        skip = [BLOCK * len(blocks) for blocks in cached]
        past_width, width = max(skip), max(len(f) for f in fresh)
        # each row: [pad, cached prefix | pad, fresh tokens]; the mask hides the pads, positions stay the prompt's
        ids = torch.tensor([[pad_token_id] * (width - len(f)) + f for f in fresh], device=self.device)
        mask = torch.tensor(
            [[0] * (past_width - n) + [1] * n + [0] * (width - len(f)) + [1] * len(f) for n, f in zip(skip, fresh)],
            device=self.device,
        )  # (N, P + W)
        positions = torch.tensor(
            [[0] * (width - len(f)) + list(range(n, n + len(f))) for n, f in zip(skip, fresh)], device=self.device
        )  # (N, W)
        cache = self._prefix_kv(cached, past_width)
        logits = model_forward(self.model, ids, mask, positions, cache)  # (N, V)

        def fresh_kv(i: int) -> LayerKV:
            start = past_width + width - len(fresh[i])  # the row's first fresh token in the cache's columns
            return [(layer.keys[i, :, start:], layer.values[i, :, start:]) for layer in cache.layers]

        self._append(cache, mask, [n + len(f) for n, f in zip(skip, fresh)])
        return logits, fresh_kv

    def _prefix_kv(self, cached: list[list[BlockKV]], past_width: int):
        """A cache holding each row's cached prefix, left-padded to `past_width` (empty without hits)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if past_width == 0:
            return cache
        some_block = next(blocks for blocks in cached if blocks)[0]
        for layer, (ref_k, ref_v) in enumerate(some_block):
            keys = [_row_prefix(blocks, layer, 0, ref_k, past_width) for blocks in cached]  # (heads, P, head_dim)
            values = [_row_prefix(blocks, layer, 1, ref_v, past_width) for blocks in cached]
            cache.update(torch.stack(keys), torch.stack(values), layer)  # (N, heads, P, head_dim)
        return cache

    def _append(self, cache, mask: torch.Tensor, lengths: list[int]) -> None:
        """Add prefilled rows: the prefill's `cache` and `mask` `(N, C)`, each row holding `lengths[i]` tokens."""
        positions = torch.tensor(lengths, device=self.device)
        if not len(self):
            self.cache, self.mask, self.positions = cache, mask, positions
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_pad_left(old.keys, width, 2), _pad_left(new.keys, width, 2)])
            old.values = torch.cat([_pad_left(old.values, width, 2), _pad_left(new.values, width, 2)])
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])  # (B + N, width)
        self.positions = torch.cat([self.positions, positions])

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits `(B, V)` of one decode step of every row, `tokens` `(B,)` their last sampled tokens."""
        ones = torch.ones(len(self), 1, dtype=self.mask.dtype, device=self.device)
        self.mask = torch.cat([self.mask, ones], dim=1)  # (B, L + 1)
        logits = model_forward(self.model, tokens[:, None], self.mask, self.positions[:, None], self.cache)
        self.positions = self.positions + 1
        return logits

    def remove(self, finished: list[int]) -> list[int]:
        """Drop rows `finished` (indices); returns the remaining rows' old indices, in their (unchanged) order."""
        gone = set(finished)
        keep = [i for i in range(len(self)) if i not in gone]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.mask, self.positions = self.mask[index], self.positions[index]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self._trim_left_padding()
        return keep

    def _trim_left_padding(self) -> None:
        """Drop cache columns that no remaining row attends to (left padding of rows that left)."""
        used = self.mask.any(0).nonzero()
        first = int(used[0]) if len(used) else self.mask.shape[1]
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


def _row_prefix(blocks: list[BlockKV], layer: int, which: int, like: torch.Tensor, width: int) -> torch.Tensor:
    """One row's cached keys (`which` 0) or values (1) of `layer`, `(heads, width, head_dim)`, left-padded."""
    parts = [block[layer][which] for block in blocks]
    prefix = torch.cat(parts, 1) if parts else like.new_zeros(like.shape[0], 0, like.shape[2])
    return _pad_left(prefix, width, 1)


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad `tensor` at the start of `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def supports_continuous_batching(model) -> bool:
    """Whether the model's cache is the plain per-layer key/value kind `DecodeBatch` can merge and split."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - a config the cache cannot read: fall back to static batches
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)
