"""What each piece of TicTacToe skill is worth against the random agent: scripted policies, no model.

Each policy plays 20,000 games in each seat against a uniformly random opponent; the table gives its win rate.
It shows what a learned policy must do to reach a given win rate vs random (docs/learning.md). Run on demand:

    python benchmarks/tictactoe_heuristics.py
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
Board = list[int]  # 0 empty, 1 and 2 the players
Policy = Callable[[Board, int, random.Random], int]


def wins(board: Board, player: int) -> bool:
    """Whether `player` holds a whole line."""
    return any(all(board[i] == player for i in line) for line in LINES)


def free(board: Board) -> list[int]:
    """The empty cells."""
    return [i for i in range(9) if board[i] == 0]


def completing_lines(board: Board, player: int, cell: int) -> list[tuple[int, int, int]]:
    """The lines through the empty `cell` whose other two cells `player` holds."""
    return [line for line in LINES if cell in line and all(board[i] == player for i in line if i != cell)]


def completing_cells(board: Board, player: int) -> list[int]:
    """The empty cells that complete a line for `player`."""
    return [cell for cell in free(board) if completing_lines(board, player, cell)]


def completing(board: Board, player: int) -> int | None:
    """A cell that completes a line for `player`, if any."""
    cells = completing_cells(board, player)
    return cells[0] if cells else None


def random_move(board: Board, player: int, rng: random.Random) -> int:
    """Any empty cell, uniformly."""
    return rng.choice(free(board))


def center_first(board: Board, player: int, rng: random.Random) -> int:
    """The center when it is empty."""
    return 4 if board[4] == 0 else random_move(board, player, rng)


def win_first(board: Board, player: int, rng: random.Random) -> int:
    """A cell that wins at once when there is one."""
    cell = completing(board, player)
    return random_move(board, player, rng) if cell is None else cell


def win_first_center(board: Board, player: int, rng: random.Random) -> int:
    """Win at once, else the center."""
    cell = completing(board, player)
    return center_first(board, player, rng) if cell is None else cell


def win_block_center(board: Board, player: int, rng: random.Random) -> int:
    """Win at once, else stop the opponent's win, else the center."""
    for who in (player, 3 - player):
        cell = completing(board, who)
        if cell is not None:
            return cell
    return center_first(board, player, rng)


POLICIES: dict[str, Policy] = {
    "random": random_move,
    "center first, else random": center_first,
    "complete a line, else random": win_first,
    "complete a line, else center, else random": win_first_center,
    "complete, else block, else center, else random": win_block_center,
}


def play(policy: Policy, seat: int, rng: random.Random) -> int:
    """One game of `policy` in `seat` (1 moves first) against the random agent: +1 win, 0 draw, -1 loss."""
    board, player = [0] * 9, 1
    while True:
        move = policy(board, player, rng) if player == seat else random_move(board, player, rng)
        board[move] = player
        if wins(board, player):
            return 1 if player == seat else -1
        if not free(board):
            return 0
        player = 3 - player


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=20_000, help="games per seat")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{'policy':48} win rate vs random ({2 * args.games} games, both seats)")
    for name, policy in POLICIES.items():
        results = [play(policy, seat, rng) for seat in (1, 2) for _ in range(args.games)]
        print(f"{name:48} {sum(r == 1 for r in results) / len(results):.3f}")


if __name__ == "__main__":
    main()
