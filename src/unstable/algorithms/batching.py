"""From steps to tensors: exact token sequences, completion masks and token-budget micro-batches.

The layer between the records and the algorithms: `pack_micro_batches` groups a batch's rows by length and
`collate` turns one group into a `TokenBatch` that remembers which rows of the original batch it holds
(`TokenBatch.rows`), so a caller can put per-row results back in input order without tricks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from unstable.records import Step


@dataclass
class TokenBatch:
    """Right-padded `prompt + completion` sequences; every `(B, L-1)` tensor is aligned to the targets.

    `rows[b]` is the index, in the list of steps the batch was cut from, of row `b`. `temperature[b]` and
    `top_p[b]` describe the distribution row `b`'s log-probs are taken under (`scoring_settings`).
    """

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    completion_mask: torch.Tensor  # (B, L-1) 1.0 where the target token is a (kept) completion token
    behaviour_logprobs: torch.Tensor  # (B, L-1) sampling-policy log-prob of each target, 0 elsewhere
    rewards: torch.Tensor  # (B,)
    rows: torch.Tensor  # (B,) long, indices into the original list of steps
    steps: list[Step]
    temperature: torch.Tensor  # (B,) > 0
    top_p: torch.Tensor  # (B,) in (0, 1]; 1 means no truncation

    def to(self, device: str) -> TokenBatch:
        """The batch with its tensors on `device` (`rows` stays on the CPU, it indexes Python lists)."""
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            completion_mask=self.completion_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            rewards=self.rewards.to(device),
            temperature=self.temperature.to(device),
            top_p=self.top_p.to(device),
        )


def scoring_settings(step: Step) -> tuple[float, float]:
    """The temperature and top_p whose distribution `step`'s behaviour log-probs are under: those it was sampled
    with, except greedy decoding (temperature 0), whose log-probs are the untruncated temperature-1 ones."""
    return (step.temperature, step.top_p) if step.temperature > 0 else (1.0, 1.0)


def sequence_length(step: Step, max_train_len: int | None) -> int:
    """Tokens of `step` the learner trains on: prompt + completion, cut to the first `max_train_len`."""
    full = len(step.prompt_token_ids) + len(step.completion_token_ids)
    return full if max_train_len is None else min(full, max_train_len)


def collate(
    steps: list[Step], pad_id: int, max_train_len: int | None = None, rows: list[int] | None = None
) -> TokenBatch:
    """Build a TokenBatch of `steps` (whose indices in the caller's list are `rows`, default 0..B-1).

    Sequences longer than `max_train_len` keep their first tokens (the original API's rule).
    """
    length = max(sequence_length(s, max_train_len) for s in steps)
    batch = len(steps)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)  # (B, L)
    attention = torch.zeros((batch, length), dtype=torch.long)  # (B, L)
    completion = torch.zeros((batch, length - 1))  # (B, L-1)
    behaviour = torch.zeros((batch, length - 1))  # (B, L-1)
    for row, step in enumerate(steps):
        kept = sequence_length(step, max_train_len)
        tokens = (list(step.prompt_token_ids) + list(step.completion_token_ids))[:kept]
        input_ids[row, :kept] = torch.tensor(tokens)
        attention[row, :kept] = 1
        first = len(step.prompt_token_ids)  # index of the first completion token in the sequence
        n_completion = max(kept - first, 0)
        if n_completion:
            # target position t predicts token t+1, so completion token j sits at target index first-1+j
            completion[row, first - 1 : first - 1 + n_completion] = 1.0
            behaviour[row, first - 1 : first - 1 + n_completion] = torch.tensor(step.behaviour_logprobs[:n_completion])
    rewards = torch.tensor([s.reward for s in steps], dtype=torch.float32)  # (B,)
    indices = torch.tensor(list(range(batch)) if rows is None else rows, dtype=torch.long)  # (B,)
    temperature, top_p = torch.tensor([scoring_settings(s) for s in steps], dtype=torch.float32).unbind(-1)  # (B,)
    return TokenBatch(input_ids, attention, completion, behaviour, rewards, indices, list(steps), temperature, top_p)


def decision_positions(batch: TokenBatch) -> torch.Tensor:
    """Input position of each row's last prompt token, whose hidden state encodes the decision's state, `(B,)`.

    Target index `first - 1` predicts the first completion token, so it is also the input position of the last
    prompt token. A row whose completion was cut off entirely by `max_train_len` uses its last kept token.
    """
    first_target = batch.completion_mask.argmax(-1)  # (B,)
    last_kept = batch.attention_mask.sum(-1) - 1  # (B,)
    return torch.where(batch.completion_mask.any(-1), first_target, last_kept)


PROMPT_TREE_LEVELS = 4
"""Levels of the prompt tree `share_prompts` runs level by level; below the last, each distinct prompt's rest is
run whole (bounding a micro-batch's decoder calls at this plus one)."""


@dataclass
class PromptLevel:
    """One level of the prompt tree: each node's tokens, run at once, attending to its ancestors' keys and values.
    A prompt that ended above the level is carried through it as a node of padding only."""

    parent: torch.Tensor  # (n,) long: each node's parent among the level above (0 for the first level)
    ids: torch.Tensor  # (n, width) right-padded tokens
    mask: torch.Tensor  # (n, width) 1 on real tokens
    offsets: torch.Tensor  # (n,) long: the position of each node's first token in its prompts


@dataclass
class SharedPrompts:
    """A micro-batch cut for the `shared-prompts` layout: the prompts' tree of shared prefixes, up to each row's
    decision position, run level by level (`levels`; each node's tokens once, however many rows share them), then
    each row from its decision position on (`suffix_ids`: the last prompt token and the completion, whose hidden
    states are all the log-probs and encodings need), attending to its prompt's nodes (`leaf`)."""

    levels: list[PromptLevel]
    leaf: torch.Tensor  # (B,) long: each row's prompt's node in the last level
    suffix_ids: torch.Tensor  # (B, S) each row's tokens from its decision position on, right-padded
    suffix_mask: torch.Tensor  # (B, S)
    starts: torch.Tensor  # (B,) long: each row's decision position, where its suffix starts


def share_prompts(batch: TokenBatch, max_levels: int = PROMPT_TREE_LEVELS) -> SharedPrompts | None:
    """`batch` cut for the `shared-prompts` layout (see `SharedPrompts`); None when a row's decision position is
    its first token (an empty prompt: nothing to share)."""
    starts = decision_positions(batch)  # (B,)
    if int(starts.min()) < 1:
        return None
    rows = batch.input_ids.tolist()
    prompts = [tuple(row[:start]) for row, start in zip(rows, starts.tolist())]
    levels, leaf_of = _tree_levels(_prompt_tree(sorted(set(prompts)), 0, 0, max_levels))
    lengths = batch.attention_mask.sum(-1).tolist()
    suffix_ids, suffix_mask = _right_padded([row[s:n] for row, s, n in zip(rows, starts.tolist(), lengths)])
    device = batch.input_ids.device
    return SharedPrompts(
        [PromptLevel(*(t.to(device) for t in (lv.parent, lv.ids, lv.mask, lv.offsets))) for lv in levels],
        torch.tensor([leaf_of[p] for p in prompts], device=device),
        suffix_ids.to(device),
        suffix_mask.to(device),
        starts,
    )


@dataclass
class _Node:
    """A node of the prompt tree: its tokens from `offset` on, and its children, or the prompt that ends here."""

    tokens: tuple
    offset: int
    children: list[_Node]
    prompt: tuple | None = None


def _prompt_tree(prompts: list[tuple], offset: int, depth: int, max_levels: int) -> list[_Node]:
    """The tree of the sorted distinct `prompts` (all equal before `offset`) from `depth` down: their common tokens
    as one node, then one subtree per next token, a prompt that ends there as a child of no tokens; one leaf per
    prompt at the last level. Prompts with no first token in common start several trees."""
    if len(prompts) == 1 or depth == max_levels - 1:
        return [_Node(p[offset:], offset, [], p) for p in prompts]
    end = offset + _common_length(prompts, offset)
    children = []
    for token, group in itertools.groupby(prompts, key=lambda p: p[end] if len(p) > end else None):
        group = list(group)
        if token is None:  # the one prompt that ends at `end` (they are distinct)
            children.append(_Node((), end, [], group[0]))
        else:
            children += _prompt_tree(group, end, depth + 1 if end > offset else depth, max_levels)
    return [_Node(prompts[0][offset:end], offset, children)] if end > offset else children


def _tree_levels(roots: list[_Node]) -> tuple[list[PromptLevel], dict[tuple, int]]:
    """The tree's nodes level by level, a prompt that ended above the deepest level carried down as nodes of no
    tokens; and each prompt's node in the last level."""
    levels, current = [], [(0, node) for node in roots]
    while True:
        ids, mask = _right_padded([node.tokens for _, node in current])
        parents, offsets = zip(*[(parent, node.offset) for parent, node in current])
        levels.append(PromptLevel(torch.tensor(parents), ids, mask, torch.tensor(offsets)))
        if all(not node.children for _, node in current):
            return levels, {node.prompt: index for index, (_, node) in enumerate(current)}
        current = [
            (index, child)
            for index, (_, node) in enumerate(current)
            for child in node.children or [_Node((), node.offset + len(node.tokens), [], node.prompt)]
        ]


def _common_length(prompts: list[tuple], offset: int) -> int:
    """How many tokens from `offset` on every prompt has in common."""
    first, last = prompts[0], prompts[-1]  # sorted: the first and the last differ first
    length = 0
    while offset + length < min(len(first), len(last)) and first[offset + length] == last[offset + length]:
        length += 1
    return length


def _right_padded(sequences: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as a right-padded `(n, longest)` tensor (pad 0) and its mask."""
    longest = max(map(len, sequences), default=0)
    ids = torch.zeros((len(sequences), longest), dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, : len(tokens)] = 1
    return ids, mask


def pack_micro_batches(
    steps: list[Step],
    token_budget: int,
    max_rows: int | None = None,
    max_train_len: int | None = None,
    min_count: int = 0,
) -> list[list[int]]:
    """Split `steps` into micro-batches whose padded size (rows x longest) stays within `token_budget`, at least
    `min_count` of them (the one with most rows halved until there are).

    Returns lists of indices into `steps`. Indices are sorted by sequence length first so padding is small;
    a single step longer than the budget gets a micro-batch of its own.
    """
    if min_count > len(steps):
        raise ValueError(f"{len(steps)} steps cannot make {min_count} micro-batches")
    order = sorted(range(len(steps)), key=lambda i: sequence_length(steps[i], max_train_len))
    groups: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = sequence_length(steps[index], max_train_len)  # sorted: the newcomer is the longest
        too_many = max_rows is not None and len(current) >= max_rows
        if current and (too_many or (len(current) + 1) * longest > token_budget):
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    while len(groups) < min_count:
        largest = max(range(len(groups)), key=lambda g: len(groups[g]))
        half = len(groups[largest]) // 2
        groups[largest : largest + 1] = [groups[largest][:half], groups[largest][half:]]
    return groups


def micro_batches(
    steps: list[Step],
    pad_id: int,
    token_budget: int,
    *,
    max_rows: int | None = None,
    max_train_len: int | None = None,
    min_count: int = 0,
    device: str = "cpu",
) -> list[TokenBatch]:
    """`steps` packed by `pack_micro_batches`, collated with their row indices and moved to `device`."""
    return [
        collate([steps[i] for i in group], pad_id, max_train_len, rows=group).to(device)
        for group in pack_micro_batches(steps, token_budget, max_rows, max_train_len, min_count)
    ]


@torch.no_grad()
def completion_totals(
    batches: Iterable[TokenBatch], token_logprobs: Callable[[TokenBatch], torch.Tensor], count: int
) -> list[float]:
    """The summed completion log-prob of each of `count` steps, in their order, with `token_logprobs` giving a
    batch's `(B, L-1)` token log-probs (a policy's, a reference's)."""
    totals = torch.zeros(count)
    for batch in batches:
        totals[batch.rows] = (token_logprobs(batch) * batch.completion_mask).sum(-1).float().cpu()  # (b,)
    return totals.tolist()
