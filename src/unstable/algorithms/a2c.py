"""A2C: policy gradient with a learned state value as the baseline, its target optionally bootstrapped.

A value head reads the model's last hidden state at the last prompt token (the state the decision was made
in). With V_i its prediction, r_i the step's reward (the game's outcome for that decision, after shaping) and
s'_i the state of the same player's next decision in the game (`Step.next_prompt_token_ids`, `link_decisions`):

    G_i        = (1 - b) r_i + b V(s'_i)    if the player decides again, else r_i    (V(s'_i) without gradient)
    A_i        = G_i - V_i                                                           (V_i detached)
    pg_loss    = -(1/N) sum_i A_i * sum_t w_it log pi(a_it | s_i, a_i<t) / D
    value_loss = (1/N) sum_i (V_i - G_i)^2
    loss       = pg_loss + value_coef * value_loss

b = `bootstrap`: 0 (the default) is the Monte Carlo target, every decision credited with its game's result;
1 is the temporal difference TD(0): a decision is credited with the change in value it caused, so a move that
wins at once stands out from the moves of a game won later, at the price of the critic's bias. Rewards arrive
only at a game's end, so there is no discount on V(s'_i) (a `DiscountLaterDecisions` reward transform, if
configured, already shapes r_i).
The value loss trains the head and, through the shared hidden state, the policy's own weights. One optimizer
step per batch; the head's parameters join the learner's optimizer (at `value_lr`). D and the truncated importance
weights w (1 with `importance_cap` None) as in `Reinforce`.
Data-parallel learners each take an equal shard of the batch (both losses are means over steps); the head's
gradients are averaged with the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import torch

from unstable.algorithms.base import BaseAlgo, check_importance, importance_metrics, importance_weights, normalized_sum
from unstable.algorithms.batching import TokenBatch
from unstable.algorithms.trainable import TrainablePolicy
from unstable.algorithms.value import attach_value_head
from unstable.records import Step
from unstable.tracking import keys


class A2C(BaseAlgo):
    """Advantage actor-critic on whole completions with a value head on the decision state."""

    def __init__(
        self,
        value_coef: float = 0.5,
        value_lr: float | None = 1e-3,
        value_hidden_sizes: Sequence[int] = (),
        bootstrap: float = 0.0,
        max_generation_len: int | None = None,
        importance_cap: float | None = None,
        importance_level: Literal["token", "sequence"] = "token",
    ):
        if not 0.0 <= bootstrap <= 1.0:
            raise ValueError(f"bootstrap must be in [0, 1], got {bootstrap}")
        check_importance(importance_cap, importance_level)
        self.importance_cap = importance_cap
        self.importance_level = importance_level
        self.value_coef = value_coef
        self.value_lr = value_lr
        self.value_hidden_sizes = tuple(value_hidden_sizes)
        self.bootstrap = bootstrap
        self.max_generation_len = max_generation_len
        self.value_head = None

    def initialize(self, policy: TrainablePolicy) -> None:
        """Create the value head and hand its parameters to the policy's optimizer."""
        self.value_head = attach_value_head(policy, self.value_hidden_sizes, self.value_lr)

    def update(self, steps: list[Step], policy: TrainablePolicy) -> dict[str, float]:
        """One gradient step over the whole batch (this learner's shard of it)."""
        steps = policy.shard(steps)
        n = len(steps)
        targets = self.targets(steps, policy)  # (N,)
        totals = {keys.LOSS: 0.0, keys.PG_LOSS: 0.0, keys.VALUE_LOSS: 0.0, keys.VALUE_MEAN: 0.0}
        capped, tokens = 0.0, 0.0
        for batch in self.prepare_batch(steps, policy):
            out = policy.forward(batch, encodings=True)
            values = self.value_head(out.encodings)  # (b,)
            policy.track_ratios(out.logprobs, batch)
            weights, batch_capped = importance_weights(out.logprobs, batch, self.importance_cap, self.importance_level)
            capped, tokens = capped + batch_capped, tokens + float(batch.completion_mask.sum())
            batch_targets = targets[batch.rows].to(values.device)
            pg_loss, value_loss = self.loss(out.logprobs, values, batch_targets, batch, n, weights)
            loss = pg_loss + self.value_coef * value_loss
            loss.backward()
            totals[keys.LOSS] += loss.item()
            totals[keys.PG_LOSS] += pg_loss.item()
            totals[keys.VALUE_LOSS] += value_loss.item()
            totals[keys.VALUE_MEAN] += values.detach().sum().item() / n
        totals[keys.GRAD_NORM] = policy.optimizer_step()
        return totals | importance_metrics(self.importance_cap, capped, tokens)

    @torch.no_grad()
    def targets(self, steps: list[Step], policy: TrainablePolicy) -> torch.Tensor:
        """Each step's value target G_i (see the module docstring), `(N,)` on the CPU."""
        targets = torch.tensor([s.reward for s in steps], dtype=torch.float32)  # (N,)
        rows = [i for i, s in enumerate(steps) if s.next_prompt_token_ids] if self.bootstrap > 0 else []
        if not rows:
            return targets
        next_states = [
            replace(steps[i], prompt_token_ids=steps[i].next_prompt_token_ids, completion_token_ids=()) for i in rows
        ]
        next_values = torch.zeros(len(rows))  # (M,)
        for batch in policy.micro_batches(next_states):
            next_values[batch.rows] = self.value_head(policy.forward(batch, encodings=True).encodings).float().cpu()
        index = torch.tensor(rows)  # (M,)
        targets[index] = (1 - self.bootstrap) * targets[index] + self.bootstrap * next_values
        return targets

    def loss(
        self,
        logp: torch.Tensor,
        values: torch.Tensor,
        targets: torch.Tensor,
        batch: TokenBatch,
        n: int,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This micro-batch's shares of pg_loss and value_loss over `n` steps, given its value targets G_i (and each
        token's importance weight, when given)."""
        advantages = targets - values.detach()  # (b,)
        weighted = logp if weights is None else logp * weights
        seq_logp = normalized_sum(weighted, batch.completion_mask, self.max_generation_len)  # (b,)
        pg_loss = -(advantages * seq_logp).sum() / n
        value_loss = ((values - targets) ** 2).sum() / n
        return pg_loss, value_loss

    def check_sharding(self) -> None:
        """Refused: its value head trains outside the sharded model, and the ranks' next-state passes differ in
        number."""
        raise ValueError(
            "a2c cannot train a sharded model (learner.sharding fsdp): its value head's parameters sit outside the "
            "model, and each rank bootstraps a different number of next states; use learner.sharding: none"
        )

    def state_dict(self) -> dict[str, Any]:
        """The value head's weights."""
        return {"value_head": self.value_head.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the value head."""
        self.value_head.load_state_dict(state["value_head"])
