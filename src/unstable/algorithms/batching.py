"""From steps to tensors: exact token sequences, completion masks and token-budget micro-batches.

The layer between the records and the algorithms: `pack_micro_batches` groups a batch's rows by length and
`collate` turns one group into a `TokenBatch` that remembers which rows of the original batch it holds
(`TokenBatch.rows`), so a caller can put per-row results back in input order without tricks.
"""

from __future__ import annotations

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
