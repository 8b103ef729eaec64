"""What each piece of TicTacToe skill is worth against the random agent: the scripted rule agents, no model.

Each agent of `unstable.agents.scripted` built from TicTacToe rules plays 20,000 games in each seat against a
uniformly random opponent; the table gives its win rate (the figures in the agents' docstrings). It shows what a
learned policy must do to reach a given win rate vs random (docs/learning.md). The games run on the board alone
(`unstable.games.tictactoe`), not through TextArena, so 200,000 games take about a minute. Run on demand:

    python benchmarks/tictactoe_heuristics.py
"""

from __future__ import annotations

import argparse

from unstable.agents.scripted import (
    TicTacToeCenterAgent,
    TicTacToeRulesAgent,
    TicTacToeWinAgent,
    TicTacToeWinBlockAgent,
    TicTacToeWinBlockCenterAgent,
    TicTacToeWinCenterAgent,
)
from unstable.games import tictactoe

AGENTS: dict[str, type[TicTacToeRulesAgent]] = {
    "random": TicTacToeRulesAgent,
    "center first, else random": TicTacToeCenterAgent,
    "complete a line, else random": TicTacToeWinAgent,
    "complete a line, else center, else random": TicTacToeWinCenterAgent,
    "complete, else block, else random": TicTacToeWinBlockAgent,
    "complete, else block, else center, else random": TicTacToeWinBlockCenterAgent,
}


def play(agent: TicTacToeRulesAgent, random_agent: TicTacToeRulesAgent, seat: int) -> int:
    """One game of `agent` as player `seat` (0 opens) against `random_agent`: +1 win, 0 draw, -1 loss."""
    board = tictactoe.EMPTY_BOARD
    for turn in range(9):
        mover = agent if turn % 2 == seat else random_agent
        board = tictactoe.place(board, mover.choose_cell(board), tictactoe.MARKS[turn % 2])
        if tictactoe.winner(board):
            return 1 if mover is agent else -1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=20_000, help="games per seat")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'agent':48} {'name':28} win rate vs random ({2 * args.games} games, both seats)")
    for label, cls in AGENTS.items():
        agent, random_agent = cls(seed=args.seed), TicTacToeRulesAgent(seed=args.seed + 1)
        results = [play(agent, random_agent, seat) for seat in (0, 1) for _ in range(args.games)]
        print(f"{label:48} {cls.name:28} {sum(r == 1 for r in results) / len(results):.3f}")


if __name__ == "__main__":
    main()
