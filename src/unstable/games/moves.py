"""Legal moves read from a TextArena observation, for scripted agents and random play.

Parsers read the *current* state (the last moves line, the last pile block, the last board) so they work on
the observations of both `-train` envs (prompt, game messages, current board) and default envs (the whole
history).
"""

from __future__ import annotations

import re

_OFFERED_MOVES = re.compile(r"(?:available|valid|legal) (?:moves|actions)[^:\n]*:([^\n]*)", re.IGNORECASE)
_BRACKETED = re.compile(r"\[[^\[\]\n]+\]")
_NIM_PILE = re.compile(r"^\s*pile \d+: (\d+)\s*$", re.MULTILINE)
_CONNECT_FOUR_COLUMNS = 7


def nim_piles(observation: str) -> list[int]:
    """Nim pile sizes from the last 'Current Pile:' block, pile 0 first ([] when there is none)."""
    if "Current Pile:" not in observation:
        return []
    return [int(size) for size in _NIM_PILE.findall(observation.rsplit("Current Pile:", 1)[1])]


def _connect_four_moves(observation: str) -> list[str]:
    """'[col c]' for every column whose top cell is empty on the last Connect Four board."""
    rows = observation.rpartition("Board state:")[2].split("-------------")[-1].split()
    return [f"[col {col}]" for col, cell in enumerate(rows[:_CONNECT_FOUR_COLUMNS]) if cell == "."]


def legal_moves(observation: str) -> list[str]:
    """The moves the current player may make, in the order shown; [] when none can be read.

    Reads the bracketed moves on the last line like "Available Moves: '[0]', '[1]'" or "Your available
    actions are: '[check]', '[bet]'". Nim and Connect Four list no moves: for Nim every '[pile quantity]'
    allowed by the last 'Current Pile:' block is returned, for Connect Four every '[col c]' not yet full on
    the last 'Board state:'.
    """
    offered = _OFFERED_MOVES.findall(observation)
    if offered:
        return _BRACKETED.findall(offered[-1])
    if "Current Pile:" in observation:
        return [f"[{pile} {take}]" for pile, size in enumerate(nim_piles(observation)) for take in range(1, size + 1)]
    if "Board state:" in observation:
        return _connect_four_moves(observation)
    return []
