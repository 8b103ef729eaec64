"""TicTacToe board logic, once: the board read from a TextArena observation, its lines, who moves, who has won, and
the cells that complete a line (to win at once) or stop the opponent's (to block). Scripted agents, the skill probe
and the heuristics benchmark all use it.

A board is 9 characters, cell 0 first (cells run left to right, top to bottom): 'O' (TextArena's player 0, who
always opens), 'X' (player 1) or ' ' (empty).
"""

from __future__ import annotations

import re

Line = tuple[int, int, int]
LINES: tuple[Line, ...] = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = ("O", "X")  # player 0's mark, player 1's
EMPTY = " "
EMPTY_BOARD = EMPTY * 9
CENTER = 4
_BOARD_ROW = re.compile(r"^\s*(\S)\s*\|\s*(\S)\s*\|\s*(\S)\s*$", re.MULTILINE)


def read_board(observation: str) -> str:
    """The last 'Current Board:' grid of a TextArena TicTacToe observation (either env: `-train` or default)."""
    if "Current Board:" not in observation:
        raise ValueError("no 'Current Board:' in the observation; is this TicTacToe?")
    rows = _BOARD_ROW.findall(observation.rsplit("Current Board:", 1)[1])[:3]
    if len(rows) != 3:
        raise ValueError("could not read three board rows after 'Current Board:'")
    return "".join(mark if mark in MARKS else EMPTY for row in rows for mark in row)


def to_move(board: str) -> str:
    """The mark of the player to move: 'O' when both have placed as many marks, else 'X'."""
    return MARKS[0] if board.count(MARKS[0]) == board.count(MARKS[1]) else MARKS[1]


def opponent(mark: str) -> str:
    """The other player's mark."""
    return MARKS[1] if mark == MARKS[0] else MARKS[0]


def empty_cells(board: str) -> list[int]:
    """The empty cells, in order."""
    return [cell for cell, mark in enumerate(board) if mark == EMPTY]


def place(board: str, cell: int, mark: str) -> str:
    """The board with `mark` on `cell`."""
    return board[:cell] + mark + board[cell + 1 :]


def winner(board: str) -> str | None:
    """The mark that holds a whole line, or None."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def completing_lines(board: str, mark: str, cell: int) -> list[Line]:
    """The lines through the empty `cell` whose other two cells `mark` holds."""
    return [line for line in LINES if cell in line and all(board[i] == mark for i in line if i != cell)]


def winning_cells(board: str, mark: str) -> list[int]:
    """The empty cells that complete a line for `mark`: where it wins at once."""
    return [cell for cell in empty_cells(board) if completing_lines(board, mark, cell)]


def blocking_cells(board: str, mark: str) -> list[int]:
    """The empty cells that stop the opponent of `mark` winning at once on its next move."""
    return winning_cells(board, opponent(mark))


def line_kind(line: Line) -> str:
    """'row', 'column' or 'diagonal'."""
    step = line[1] - line[0]
    return "row" if step == 1 else "column" if step == 3 else "diagonal"
