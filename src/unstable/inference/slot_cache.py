"""Decoding over a preallocated KV cache, each decode step one CUDA graph replay on a GPU (gpt-fast's recipe).

A `SlotCache` gives every running row a slot of preallocated key and value tensors, `(layers, slots, length,
kv_heads, head_dim)`: the row's token at position p sits in column p of its slot, so a decode step writes one column
per row in place; nothing is padded or concatenated (the `PaddedCache` of `decoding.py` copies its whole cache at
every step). The rows hold slots 0..B-1: a row that leaves hands its slot to the last row.

The decode step is this module's own pass over the model's layers (`slot_forward`, for the Llama-family decoders of
`SUPPORTED_MODEL_TYPES`; a prefill is the same pass over a row's prompt tokens, `SlotCache.prefill`), each layer's
query, key and value projections one matrix product and its MLP's gate and up projections another (`fuse_projections`).
It reads the first `Lb` columns of the first `Bb` slots, `Bb` and `Lb` the batch and length buckets at or above the
batch's rows and its longest context, each row attending to its own columns through a mask. On a GPU the step for each
(Bb, Lb) is captured once as a CUDA graph and replayed: one launch instead of ~1,600 kernel launches whose CPU time
bound the step (experiments/log.md, the H100 entry). With `compile` its decoder layer is compiled by `torch.compile`
first, one function run by every layer (`decoder_layer`: fused elementwise kernels, fewer and shorter in each graph;
one compile whatever the depth), for the decode step and, apart, for prefills (at least 2 rows of 2 tokens). On the
CPU the same pass runs eagerly on the exact batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from unstable.inference.lora import BatchedLoRALinear
from unstable.inference.prefix_cache import BLOCK, BlockKV, LayerKV

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
FUSED = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}  # one product each
LENGTH_STEP = 32  # columns per length bucket up to 1,024
MIN_COLUMNS = 256  # the cache's first allocation, in columns (it grows by doubling)
MIN_BUCKET = 2  # the smallest captured batch: torch.compile specializes a dimension of size 1 (a second compile)


def supports_slot_decoding(model) -> bool:
    """Whether `slot_forward` computes `model`'s decode step: a Llama-family decoder whose every layer attends to
    the whole context, with rotary embeddings that do not change with the sequence length."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return False
    layer_types = getattr(config, "layer_types", None)
    windowed = (
        any(t != "full_attention" for t in layer_types) if layer_types else getattr(config, "sliding_window", None)
    )
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    return not windowed and rope_type not in ("dynamic", "longrope")


def batch_bucket(rows: int) -> int:
    """The captured batch size serving `rows` rows: powers of two up to 8, then multiples of 8, 16 past 64, 32 past
    256 (at most 1/8 of a step's rows are padding past 8)."""
    if rows <= 8:
        return 1 << (rows - 1).bit_length()
    step = 8 if rows <= 64 else 16 if rows <= 256 else 32
    return -(-rows // step) * step


def length_bucket(columns: int) -> int:
    """The captured context length covering `columns` columns: a multiple of `LENGTH_STEP`, and past 1,024 columns
    of 1/32 of the power of two at or below `columns` (32 buckets an octave: past 1,024, less than 1/16 of the
    columns a step reads lie beyond the longest row)."""
    step = max(LENGTH_STEP, 1 << max(columns.bit_length() - 6, 0))
    return -(-columns // step) * step


def fuse_projections(model) -> list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]]:
    """Per decoder layer, the weights (and biases) of its query, key and value projections concatenated into one
    tensor, and of its MLP's gate and up projections into another, the model's own parameters becoming views into
    them (a weight loaded in place reaches both): `slot_forward` runs 4 matrix products a layer instead of 7 (on
    an H200, 196 small matrix-vector products were most of a batch-1 step's GPU time, experiments/log.md)."""
    return [
        {part: _fused([getattr(getattr(layer, part), name) for name in names]) for part, names in FUSED.items()}
        for layer in model.model.layers
    ]


def _fused(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (weight, bias) for `linears` (outputs concatenated), each linear's own parameters made views into it."""
    weight = torch.cat([linear.weight.detach() for linear in linears])  # (sum of outs, in)
    biased = linears[0].bias is not None
    bias = torch.cat([linear.bias.detach() for linear in linears]) if biased else None
    start = 0
    for linear in linears:
        rows = slice(start, start + linear.out_features)
        linear.weight = torch.nn.Parameter(weight[rows], requires_grad=False)
        if biased:
            linear.bias = torch.nn.Parameter(bias[rows], requires_grad=False)
        start = rows.stop
    return weight, bias


def decoder_layer(layer, fused, hidden, cos, sin, keys, values, slots, positions, mask, first: int, length: int):
    """`hidden` `(B, T, H)` after one decoder layer of `slot_forward` (its arguments, for this layer). One function
    for every layer, so that `torch.compile` compiles it once for them all (`SlotCache`): compiling the whole pass
    took minutes for a 28-layer model with adapters (the first LoRA checkpoint stalled the loop's engine)."""
    rows = slice(first, first + hidden.shape[0])
    attend = (keys, values, (slots, positions), mask, rows, length)
    x = _normed(layer.input_layernorm, hidden)
    hidden = hidden + _attention(layer.self_attn, fused["self_attn"], x, cos, sin, *attend)
    return hidden + _mlp(layer.mlp, fused["mlp"], _normed(layer.post_attention_layernorm, hidden))


def slot_forward(
    model, fused, tokens, positions, keys, values, length: int, first: int = 0, last=None, layer_step=decoder_layer
) -> torch.Tensor:
    """Logits `(B, V)` of the rows in slots `first`..`first + B - 1`: row b's tokens `tokens[b]` `(B, T)` at positions
    `positions[b]` of its slot, the logits those of its token `last[b]` (None: its last; a decode step is T = 1). Writes
    every token's key and value into `keys`, `values` (a `(slots, columns, kv_heads, head_dim)` tensor per layer: a
    whole tensor written in place, which `torch.compile` keeps in place; a slice of one cache tensor it copied whole at
    every step) at its position, and each token attends over its slot's first `length` columns, those up to its
    position. `fused` holds each layer's concatenated projections (`fuse_projections`); `layer_step` runs a layer
    (`decoder_layer`, or it compiled)."""
    decoder, config = model.model, model.config
    batch, width = tokens.shape
    slots = (first + torch.arange(batch, device=tokens.device))[:, None].expand(batch, width)  # (B, T)
    hidden = decoder.embed_tokens(tokens)  # (B, T, H)
    cos, sin = (t[:, :, None] for t in decoder.rotary_emb(hidden, positions))  # (B, T, 1, head_dim): every head
    visible = torch.arange(length, device=tokens.device) <= positions[:, :, None]  # (B, T, Lb)
    mask = torch.zeros(visible.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(~visible, -torch.inf)
    groups = config.num_attention_heads // config.num_key_value_heads
    mask = mask[:, None, :, None].expand(-1, -1, -1, groups, -1).reshape(batch, 1, width * groups, length)
    for index, layer in enumerate(decoder.layers):
        hidden = layer_step(
            layer, fused[index], hidden, cos, sin, keys[index], values[index], slots, positions, mask, first, length
        )
    picked = hidden[:, -1:] if last is None else hidden[torch.arange(batch, device=hidden.device), last][:, None]
    return model.lm_head(_normed(decoder.norm, picked))[:, 0]  # (B, V); a LoRA layer takes (B, T, H)


def _projected(x: torch.Tensor, fused, modules: list) -> list[torch.Tensor]:
    """Each of `modules`' outputs for `x` from one product with their `fused` (weight, bias), plus what a module's
    LoRA adapters add (`BatchedLoRALinear.delta`)."""
    bases = [getattr(module, "base", module) for module in modules]
    outputs = F.linear(x, *fused).split([base.out_features for base in bases], dim=-1)
    deltas = [module.delta(x) if isinstance(module, BatchedLoRALinear) else None for module in modules]
    return [out if delta is None else out + delta for out, delta in zip(outputs, deltas)]


def _mlp(mlp, fused, x: torch.Tensor) -> torch.Tensor:
    """A Llama-family MLP's output for `x`, its gate and up projections one product."""
    gate, up = _projected(x, fused, [mlp.gate_proj, mlp.up_proj])
    return mlp.down_proj(mlp.act_fn(gate) * up)


def _attention(attn, fused, x, cos, sin, keys, values, at, mask, rows: slice, length: int) -> torch.Tensor:
    """One layer's self-attention output `(B, T, H)` for `x` `(B, T, H)` of the slots `rows`."""
    batch, width, head_dim = x.shape[0], x.shape[1], attn.head_dim
    q, k, v = _projected(x, fused, [attn.q_proj, attn.k_proj, attn.v_proj])
    q = q.view(batch, width, -1, head_dim)  # (B, T, Hq, D)
    k = k.view(batch, width, -1, head_dim)  # (B, T, Hkv, D)
    v = v.view(batch, width, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key
        q, k = _normed(attn.q_norm, q), _normed(attn.k_norm, k)
    q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
    keys.index_put_(at, k)  # column `position` of each token's slot
    values.index_put_(at, v)
    kv_heads = k.shape[2]
    groups = q.shape[2] // kv_heads
    # (B, Hkv, T * G, D): query head h reads key head h // G, as transformers' repeat_kv
    grouped = q.view(batch, width, kv_heads, groups, head_dim).transpose(1, 2).reshape(batch, kv_heads, -1, head_dim)
    context = keys[rows, :length].transpose(1, 2), values[rows, :length].transpose(1, 2)  # (B, Hkv, Lb, D)
    out = F.scaled_dot_product_attention(grouped, *context, attn_mask=mask, scale=attn.scaling)  # (B, Hkv, T * G, D)
    out = out.view(batch, kv_heads, width, groups, head_dim).transpose(1, 2).reshape(batch, width, -1)
    return attn.o_proj(out)  # (B, T, H)


def _normed(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)` of an RMSNorm layer in fewer kernels: normalised in float32 by one `rms_norm`, cast back to `x`'s
    dtype, then scaled by the layer's weight, as transformers' Llama-family norms compute it."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:  # a norm this pass does not know: its own forward
        return norm(x)
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, the Llama way (the two halves of each head rotated)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class SlotCache:
    """The running batch's KV cache as preallocated slots (see the module docstring); with `graphs` each decode step
    runs at its (batch, length) bucket's static shape, captured as a CUDA graph on a GPU (on the CPU run eagerly,
    for tests), and `compile` compiles its decoder layer first. `attention` lists the attention
    kernels the step may use; `lora` is the model's batched LoRA (a graph is captured again when its tensors are
    replaced)."""

    def __init__(self, model, fused, device: str, attention, lora, *, graphs: bool = False, compile: bool = False):
        self.model = model
        self.fused = fused
        self.device = device
        self.attention = attention
        self.lora = lora
        self.graphs = graphs
        self.compiled = compile
        self.layer_step = _compiled(decoder_layer) if compile else decoder_layer
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.row_shape = (config.num_key_value_heads, head_dim)
        self.layers = config.num_hidden_layers
        self.keys = self._zeros(0, 0)  # per layer: (slots, columns, kv_heads, head_dim)
        self.values = self._zeros(0, 0)
        self.positions: list[int] = []  # each row's next position (its tokens in the cache), on the CPU
        self.position_buffer = torch.zeros(0, dtype=torch.long, device=device)  # (slots,) the same, on the device
        self.token_buffer = torch.zeros(0, dtype=torch.long, device=device)  # (slots,) the step's input tokens
        self.logit_buffer: torch.Tensor | None = None  # (slots, V): where every captured step writes its logits
        self._generation = 0  # changes whenever the cache's tensors are replaced
        self._captured: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = None  # the captured graphs' shared memory pool
        self._captured_for = None  # (generation, LoRA version) the graphs were captured with
        self._marked_for = None  # (generation, LoRA version) whose tensors `_mark_dynamic` marked

    def __len__(self) -> int:
        return len(self.positions)

    def clear(self) -> None:
        """Hold no row (the slots' tensors and captured graphs stay for the next rows)."""
        self.positions = []

    def prefill(self, fresh: list[list[int]], cached: list[list[BlockKV]], max_length: int, pad_token_id: int):
        """Give each new row a slot with room for `max_length` columns, holding its cached prefix (`cached[i]`,
        prefix-cache blocks), and run every row's `fresh` tokens through `slot_forward` at once (right-padded: a pad
        token writes past its row's end, where the row's decode steps write before they read). Returns the rows'
        last-token logits `(N, V)` and a function giving row i's fresh keys and values (per layer, `(heads,
        len(fresh[i]), head_dim)` each)."""
        first, count = len(self.positions), len(fresh)
        skip = [BLOCK * len(blocks) for blocks in cached]
        width = max(len(f) for f in fresh)
        padded = count
        if self.compiled:  # at least 2 rows of 2 tokens: a size of 1 would be compiled apart (the decode step's)
            width, padded = max(width, 2), max(count, MIN_BUCKET)
        end = max(skip) + width  # the columns the pass writes
        self._reserve(first + padded, max(max_length, end))
        self._copy_prefixes(first, cached)
        rows = [f + [pad_token_id] * (width - len(f)) for f in fresh] + [[pad_token_id] * width] * (padded - count)
        tokens = torch.tensor(rows, device=self.device)  # (N, W); a padding row writes into a free slot
        starts = skip + [0] * (padded - count)
        positions = torch.tensor([list(range(n, n + width)) for n in starts], device=self.device)  # (N, W)
        last = torch.tensor([len(f) - 1 for f in fresh] + [0] * (padded - count), device=self.device)  # (N,)
        self._mark_dynamic()
        with sdpa_kernel(self.attention):
            kv = (self.keys, self.values)
            logits = slot_forward(self.model, self.fused, tokens, positions, *kv, end, first, last, self.layer_step)
        logits = logits[:count]
        lengths = [n + len(f) for n, f in zip(skip, fresh)]
        self.position_buffer[first : first + count] = torch.tensor(lengths, device=self.device)
        self.positions += lengths

        def fresh_kv(i: int) -> LayerKV:
            slot, columns = first + i, slice(skip[i], lengths[i])
            return [(k[slot, columns].transpose(0, 1), v[slot, columns].transpose(0, 1)) for k, v in self._kv()]

        return logits, fresh_kv

    def _copy_prefixes(self, first: int, cached: list[list[BlockKV]]) -> None:
        """Write each new row's cached prefix blocks into the first columns of its slot."""
        for i, blocks in enumerate(cached):
            if not blocks:
                continue
            prefix = torch.cat(blocks, dim=3)  # (layers, 2, heads, columns, head_dim)
            columns = slice(0, prefix.shape[3])
            for layer, (keys, values) in enumerate(self._kv()):
                keys[first + i, columns] = prefix[layer, 0].transpose(0, 1)
                values[first + i, columns] = prefix[layer, 1].transpose(0, 1)

    def _kv(self):
        """Each layer's (keys, values) slot tensors."""
        return zip(self.keys, self.values)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits `(B, V)` of one decode step of every row, `tokens` `(B,)` their last sampled tokens."""
        batch, length = len(self.positions), length_bucket(max(self.positions) + 1)
        self._mark_dynamic()
        if self.graphs:
            logits = self._replay(tokens, batch, length)
        else:
            with sdpa_kernel(self.attention):
                args = (tokens[:, None], self.position_buffer[:batch, None], self.keys, self.values, length)
                logits = slot_forward(self.model, self.fused, *args, layer_step=self.layer_step)
        self.position_buffer[:batch] += 1
        self.positions = [p + 1 for p in self.positions]
        return logits

    def remove(self, finished: list[int]) -> list[int]:
        """Free the slots of rows `finished` (indices), moving the last rows into freed slots below the new count;
        returns the rows' new order (`order[i]`: the old index of the row now at i)."""
        survivors = len(self.positions) - len(finished)
        gone = set(finished)
        holes = [i for i in sorted(finished) if i < survivors]
        movers = [i for i in range(survivors, len(self.positions)) if i not in gone]
        order = list(range(survivors))
        if holes:
            to, source = torch.tensor(holes, device=self.device), torch.tensor(movers, device=self.device)
            used = max(self.positions[i] for i in movers)  # columns the moving rows hold
            for cached in self.keys + self.values:
                cached[to, :used] = cached[source, :used]
            self.position_buffer[to] = self.position_buffer[source]
            for hole, mover in zip(holes, movers):
                order[hole] = mover
        self.positions = [self.positions[i] for i in order]
        return order

    def _reserve(self, rows: int, columns: int) -> None:
        """Grow the cache (copying what it holds) to at least `rows` slots of `columns` columns."""
        slots, width = self.keys[0].shape[:2]
        if rows <= slots and columns <= width:
            return
        slots, width = max(slots, batch_bucket(rows), MIN_BUCKET), max(width, MIN_COLUMNS)
        while width < columns:
            width *= 2
        width = max(width, length_bucket(columns) + 1)  # no step reads every column: compiled, that was a new guard
        self.keys = [self._grown(old, slots, width) for old in self.keys]
        self.values = [self._grown(old, slots, width) for old in self.values]
        self.position_buffer = _grown_vector(self.position_buffer, slots)
        self.token_buffer = _grown_vector(self.token_buffer, slots)
        self.lora.reserve(slots)  # a padded step's rows read their LoRA weights too
        self._generation += 1

    def _mark_dynamic(self) -> None:
        """Tell the compiler which sizes change (slots and columns of the cache, slots and rank of the LoRA tensors,
        rows of the per-row LoRA weights), so that the step is compiled once for them all: dynamo took the first
        sizes it met as constants and compiled again at the next (tens of seconds each on a GPU machine). Once per
        set of tensors, and only when compiled."""
        if not self.compiled or self._marked_for == (self._generation, self.lora.version):
            return
        for cached in self.keys + self.values:
            torch._dynamo.maybe_mark_dynamic(cached, 0)
            torch._dynamo.maybe_mark_dynamic(cached, 1)
        for tensor in self.lora.tensors():
            for dim in range(tensor.dim()):
                if tensor.shape[dim] > 1:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
        self._marked_for = (self._generation, self.lora.version)

    def _zeros(self, slots: int, width: int) -> list[torch.Tensor]:
        shape = (slots, width, *self.row_shape)
        return [torch.zeros(shape, dtype=self.model.dtype, device=self.device) for _ in range(self.layers)]

    def _grown(self, old: torch.Tensor, slots: int, width: int) -> torch.Tensor:
        new = old.new_zeros(slots, width, *self.row_shape)
        new[: old.shape[0], : old.shape[1]] = old
        return new

    def _replay(self, tokens: torch.Tensor, batch: int, length: int) -> torch.Tensor:
        """The step as the captured graph of its (batch, length) bucket, captured first if new; padding rows read
        position 0 of their free slots."""
        bucket = max(batch_bucket(batch), MIN_BUCKET)
        self.token_buffer[:batch] = tokens
        self.position_buffer[batch:bucket] = 0
        graph = self._graph(bucket, length)
        graph.replay()
        return self.logit_buffer[:batch]

    def _graph(self, bucket: int, length: int):
        captured_for = (self._generation, self.lora.version)
        if captured_for != self._captured_for:  # the cache or the LoRA tensors were replaced
            pool = torch.cuda.graph_pool_handle() if self.device.startswith("cuda") else None
            self._captured, self._pool, self._captured_for = {}, pool, captured_for
            vocab = self.model.config.vocab_size
            slots = self.keys[0].shape[0]
            self.logit_buffer = torch.empty(slots, vocab, dtype=self.model.dtype, device=self.device)
        if (bucket, length) not in self._captured:
            self._captured[(bucket, length)] = self._capture(bucket, length)
        return self._captured[(bucket, length)]

    def _capture(self, bucket: int, length: int):
        """The step of `bucket` rows over `length` columns as a CUDA graph (captured after two warm-up runs on a side
        stream, which compile it if it is compiled and write the same keys and values the replay then writes); on
        the CPU the same step, run eagerly at each replay."""
        args = (self.token_buffer[:bucket, None], self.position_buffer[:bucket, None], self.keys, self.values, length)

        def step():
            with sdpa_kernel(self.attention):
                self.logit_buffer[:bucket] = slot_forward(self.model, self.fused, *args, layer_step=self.layer_step)

        if not self.device.startswith("cuda"):
            return _Uncaptured(step)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step()
        return graph


def _compiled(layer_step):
    """`layer_step` compiled by `torch.compile` for any number of rows and tokens: each call marks its per-token
    tensors' row and token counts (and the mask's columns) as changing (dynamo took the first sizes it met as
    constants, and compiled again at the next). Python floats (the layers' scaling and epsilon) are taken as constants:
    traced as symbols, each compile restarted its analysis once to specialize them (twice the tracing)."""
    compiled = torch.compile(layer_step, dynamic=True)

    def step(layer, fused, hidden, cos, sin, keys, values, slots, positions, mask, first: int, length: int):
        for per_token in (hidden, cos, sin, slots, positions):  # (B, T, ...)
            torch._dynamo.maybe_mark_dynamic(per_token, 0)
            torch._dynamo.maybe_mark_dynamic(per_token, 1)
        for dim in (0, 2, 3):  # (B, 1, T x G, L)
            torch._dynamo.maybe_mark_dynamic(mask, dim)
        with torch._dynamo.config.patch(specialize_float=True):
            return compiled(layer, fused, hidden, cos, sin, keys, values, slots, positions, mask, first, length)

    return step


class _Uncaptured:
    """A step the CPU runs eagerly where a GPU replays its graph."""

    def __init__(self, step):
        self.replay = step


def _grown_vector(old: torch.Tensor, size: int) -> torch.Tensor:
    new = old.new_zeros(size)
    new[: len(old)] = old
    return new
