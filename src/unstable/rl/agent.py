"""The `Agent` contract of `TorchTrainer`: a module that maps a list of episodes (of any type) to `AgentOutput`s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class AgentOutput:
    """What an agent computes for one episode of T actions.

    `state_encodings` is `(T + 1, state_encoding_size)`: one row per state the episode visited, the state after
    its last action included (the value function bootstraps from it when the episode was cut short).
    `action_lls` is `(T,)`: the log-likelihood of each action taken under the agent's current policy.
    `action_dists` optionally gives the T action distributions (a `torch.distributions.Distribution` with
    batch shape `(T, ...)`), used for an exact KL instead of a sampled estimate. `extra_loss` is an optional
    scalar the agent wants minimised alongside the RL loss (an auxiliary or supervised term).
    """

    state_encodings: Tensor
    action_lls: Tensor
    action_dists: torch.distributions.Distribution | None = None
    extra_loss: Tensor | None = None

    def check(self, state_encoding_size: int) -> None:
        """Raise if the shapes break the contract above."""
        n_actions = self.action_lls.shape[0]
        if self.action_lls.dim() != 1:
            raise ValueError(f"action_lls must be (T,), got shape {tuple(self.action_lls.shape)}")
        if self.state_encodings.shape != (n_actions + 1, state_encoding_size):
            raise ValueError(
                f"state_encodings must be (T + 1, state_encoding_size) = ({n_actions + 1}, {state_encoding_size}), "
                f"got {tuple(self.state_encodings.shape)}"
            )


class Agent(torch.nn.Module):
    """Base class of agents trained by `TorchTrainer`.

    Subclasses set `state_encoding_size` and implement `forward(episodes) -> list[AgentOutput]`, one output per
    episode, in order. Episodes are whatever the caller passes to `TorchTrainer.add_episode`.
    """

    state_encoding_size: int

    def forward(self, episodes: list[Any]) -> list[AgentOutput]:
        """One `AgentOutput` per episode (differentiable in the agent's parameters)."""
        raise NotImplementedError
