"""Prefix caching for the embedded engine: the KV cache of prompt prefixes that many requests share.

Game prompts repeat most of their text: the template header and the game's rules are the same for every turn
of every game played from one seat. The cache keeps the keys and values of each complete `BLOCK`-token block
of the prompts it has seen, keyed by the adapter and the whole token prefix up to the block's end (a block's
keys depend on every token before it and on the adapter's weights), evicting the least recently used blocks
beyond `max_tokens`. A new request then prefills only the tokens after its longest cached prefix.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

BLOCK = 16  # tokens per cached block

BlockKV = torch.Tensor  # (layers, 2, heads, BLOCK, head_dim): a block's keys (0) and values (1) in every layer
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values, (heads, tokens, head_dim) each


class PrefixCache:
    """Least-recently-used blocks of prompt KV cache, at most `max_tokens` tokens in all."""

    def __init__(self, max_tokens: int):
        self.max_blocks = max_tokens // BLOCK
        self.blocks: OrderedDict[tuple[str | None, tuple[int, ...]], BlockKV] = OrderedDict()
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def lookup(self, prompt: list[int], adapter: str | None) -> list[BlockKV]:
        """The cached blocks of `prompt`'s longest cached prefix, leaving at least its last token to prefill."""
        found = []
        for end in range(BLOCK, len(prompt), BLOCK):  # end < len(prompt): the last token is always computed
            key = (adapter, tuple(prompt[:end]))
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            found.append(self.blocks[key])
        self.hit_tokens += BLOCK * len(found)
        self.prompt_tokens += len(prompt)
        return found

    def store(self, prompt: list[int], adapter: str | None, first_block: int, kv: LayerKV) -> None:
        """Cache the complete blocks of `prompt` from block `first_block` on; `kv` holds, per layer, the keys
        and values `(heads, n, head_dim)` of the prompt tokens from `first_block * BLOCK` on."""
        for block in range(first_block, (len(prompt) - 1) // BLOCK):
            key = (adapter, tuple(prompt[: (block + 1) * BLOCK]))
            if key in self.blocks:
                continue
            cols = slice((block - first_block) * BLOCK, (block - first_block + 1) * BLOCK)
            self.blocks[key] = _block(kv, cols)
            while len(self.blocks) > self.max_blocks:
                self.blocks.popitem(last=False)

    def drop_adapter(self, adapter: str) -> None:
        """Forget the blocks computed with `adapter` (it was unloaded)."""
        for key in [key for key in self.blocks if key[0] == adapter]:
            del self.blocks[key]

    def clear(self) -> None:
        """Forget every block (the base weights changed)."""
        self.blocks.clear()

    def hit_rate(self) -> float:
        """The share of looked-up prompt tokens that came from the cache."""
        return self.hit_tokens / max(self.prompt_tokens, 1)


def _block(kv: LayerKV, columns: slice) -> BlockKV:
    """`columns` of every layer's keys and values copied into one new tensor: one copy a block (a kernel on a GPU),
    where a copy of each layer's keys and of its values took 2 x 28 for the Qwen3-0.6B shape."""
    return torch.stack([part[:, columns] for pair in kv for part in pair]).unflatten(0, (len(kv), 2))
