"""A state-value head on the model's hidden state at the decision, shared by A2C and VTraceAWR."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from unstable.algorithms.trainable import TrainablePolicy


class ValueHead(torch.nn.Module):
    """V(s) from a state encoding: a linear layer, or an MLP with SiLU hidden layers. The output starts at 0."""

    def __init__(self, input_size: int, hidden_sizes: Sequence[int] = ()):
        super().__init__()
        layers: list[torch.nn.Module] = []
        for size in hidden_sizes:
            layers += [torch.nn.Linear(input_size, size), torch.nn.SiLU()]
            input_size = size
        out = torch.nn.Linear(input_size, 1)
        torch.nn.init.zeros_(out.weight)
        torch.nn.init.zeros_(out.bias)
        self.net = torch.nn.Sequential(*layers, out)

    def forward(self, encodings: torch.Tensor) -> torch.Tensor:
        """Values of `(B, H)` encodings, `(B,)`."""
        return self.net(encodings).squeeze(-1)  # (B,)


def attach_value_head(policy: TrainablePolicy, hidden_sizes: Sequence[int], lr: float | None) -> ValueHead:
    """A new ValueHead sized to the policy's encodings, on its device, trained by its optimizer at `lr`."""
    head = ValueHead(policy.hidden_size, hidden_sizes).to(policy.device)
    policy.add_parameters(head.parameters(), lr=lr)
    return head
