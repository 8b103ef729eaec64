"""The policy's probability of each cell (0-8) in four positions: the empty board, and the board after the
opponent opened in a corner (0), on an edge (1) and in the center (4). One line per checkpoint.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/results/x-opponent-group4/opening.py CHECKPOINT...
"""

import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import tictactoe_probe as P  # noqa: E402

from unstable.evaluation.evaluate import scoring_policy  # noqa: E402


def after(first: int):
    """The second mover's position after the opponent took `first`."""
    env = P.make_env(P.TICTACTOE.env_id)
    env.reset(num_players=2, seed=1)
    env.step(f"[{first}]")
    _, observation = env.get_observation()
    board = [0] * 9
    board[first] = 1
    return observation, board, 2


empty = next(p for p in P.positions(40, 0) if not any(p[1]))
positions = [empty, after(0), after(1), after(4)]
print("checkpoint | empty board | after a corner (0) | after an edge (1) | after the center (4)")
for checkpoint in sys.argv[1:]:
    rows = P.cell_probabilities(scoring_policy(checkpoint), positions)
    parts = Path(checkpoint).parts
    label = f"{parts[-5]}/{parts[-4]}/{parts[-1]}"
    print(label, "|", " | ".join(" ".join(f"{x:.2f}" for x in row) for row in rows), flush=True)
