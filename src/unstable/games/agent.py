"""The seat interface a game is played through: anything that maps an observation to a Decision (the agents in
`unstable.agents` implement it)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from unstable.records import Decision


class Agent(ABC):
    """One seat's decision maker. Scripted agents return only `Decision.action`; model agents fill the tokens."""

    name: str = "agent"

    @abstractmethod
    def act(self, observation: str) -> Decision:
        """Return the move for this observation (TextArena's text, as the env rendered it)."""
