"""A person at the terminal as a seat's agent: each turn shows what the env says and reads the move typed."""

from __future__ import annotations

from collections.abc import Callable

from unstable.games.agent import Agent
from unstable.records import Decision

QUIT = "quit"


class PlayerQuit(BaseException):
    """The person ended the game (end of input or `quit`). A BaseException, like KeyboardInterrupt: `play_episode`
    records every Exception as a failed game, and a person leaving is no failure of the game."""


class HumanAgent(Agent):
    """Prints the part of each observation the person has not seen yet (TextArena's observations repeat the
    game so far) and submits the line they type, stripped, as the move; the env judges it like any other."""

    name = "human"

    def __init__(self, read: Callable[[str], str] = input, write: Callable[[str], None] = print):
        self.read = read
        self.write = write
        self.seen = ""

    def act(self, observation: str) -> Decision:
        """Show the new part of `observation`, then read one move (PlayerQuit on end of input or `quit`)."""
        new = observation.removeprefix(self.seen) if observation.startswith(self.seen) else observation
        self.seen = observation
        self.write(new.strip("\n"))
        try:
            move = self.read("your move> ").strip()
        except EOFError:
            raise PlayerQuit from None
        if move.lower() == QUIT:
            raise PlayerQuit
        return Decision(action=move)
