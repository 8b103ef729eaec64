"""What a TicTacToe checkpoint has learned, skill by skill, scored exactly rather than by playing games.

At positions from random play, every cell's move is scored as a completion with the learner's forward pass (as
Kuhn Poker's exact exploitability is) and the nine scores are renormalised into the policy's choice of cell.
Reported per checkpoint, each beside what a uniform choice among the empty cells would give:

- occupied: the mass on taken cells (moves the env rejects), over all positions;
- win: the mass on the cells that win at once, where there is one; also split by the kind of line the winning
  cell completes (row, column, diagonal: positions with one winning cell, on one line);
- block: the mass on the cells that stop the opponent's immediate win, where there is one and no win;
- center: the mass on the center on the empty board.

Writes `--out` (JSON) and prints a table. Run on demand (never from tests), e.g. a warm start against its RL run:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/tictactoe_probe.py \\
        runs/ws/seed-0/sft-TicTacToe-v0-train/checkpoints/ckpt-770 \\
        runs/x-vsrandom/seed-0/rl-TicTacToe-v0-train-reinforce/checkpoints/ckpt-200
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from tictactoe_heuristics import Board, completing_cells, completing_lines, free  # noqa: E402

from unstable.collector.demonstrations import supervised_step  # noqa: E402
from unstable.evaluation.evaluate import scoring_policy  # noqa: E402
from unstable.games.registry import make_env  # noqa: E402
from unstable.records import EnvSpec, Step  # noqa: E402

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
CENTER = 4
SKILLS = [
    "occupied",
    "win",
    "win on a row",
    "win on a column",
    "win on a diagonal",
    "block",
    "center on the empty board",
]
Position = tuple[str, Board, int]  # the observation, the board (1 moves first), the player to move (1 or 2)


def positions(count: int, seed: int) -> list[Position]:
    """`count` positions (every turn of random-vs-random games, until there are enough) with their observations."""
    rng = random.Random(seed)
    found: list[Position] = []
    while len(found) < count:
        env = make_env(TICTACTOE.env_id)
        env.reset(num_players=2, seed=rng.randrange(2**31))
        board, done = [0] * 9, False
        while not done and len(found) < count:
            env_player, observation = env.get_observation()
            player = env_player + 1
            found.append((observation, list(board), player))
            cell = rng.choice(free(board))
            board[cell] = player
            done, _ = env.step(f"[{cell}]")
    return found


def cell_probabilities(policy, batch: list[Position]) -> list[list[float]]:
    """The policy's probability of each of the nine cells at each position (renormalised over the nine)."""
    steps = [
        supervised_step(Step(TICTACTOE.env_id, player - 1, 0, observation, f"[{cell}]"), TICTACTOE, policy.tokenizer)
        for observation, _, player in batch
        for cell in range(9)
    ]
    scores = policy.completion_logprobs(steps)
    rows = []
    for i in range(len(batch)):
        logps = scores[9 * i : 9 * i + 9]
        top = max(logps)
        weights = [math.exp(lp - top) for lp in logps]
        rows.append([w / sum(weights) for w in weights])
    return rows


def line_kind(line: tuple[int, int, int]) -> str:
    """row, column or diagonal."""
    step = line[1] - line[0]
    return "row" if step == 1 else "column" if step == 3 else "diagonal"


def skills(found: list[Position], probabilities: list[list[float]]) -> dict[str, dict[str, float]]:
    """Mean mass on each skill's cells, with the uniform-choice reference and the number of positions."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # policy mass, uniform mass, positions

    def add(skill: str, cells: list[int], p: list[float], empty: list[int]) -> None:
        entry = sums[skill]
        entry[0] += sum(p[c] for c in cells)
        entry[1] += sum(c in empty for c in cells) / len(empty)
        entry[2] += 1

    for (_, board, player), p in zip(found, probabilities):
        empty = free(board)
        add("occupied", [c for c in range(9) if board[c]], p, empty)
        wins, blocks = completing_cells(board, player), completing_cells(board, 3 - player)
        if wins:
            add("win", wins, p, empty)
            lines = completing_lines(board, player, wins[0])
            if len(wins) == 1 and len(lines) == 1:
                add(f"win on a {line_kind(lines[0])}", wins, p, empty)
        elif blocks:
            add("block", blocks, p, empty)
        if len(empty) == 9:
            add("center on the empty board", [CENTER], p, empty)
    return {k: {"policy": m / n, "uniform": u / n, "positions": n} for k, (m, u, n) in sums.items()}


def probe(checkpoint: str, found: list[Position], batch_size: int = 16) -> dict[str, dict[str, float]]:
    """`skills` of the full model at `checkpoint` over the positions `found`."""
    policy = scoring_policy(checkpoint)
    probabilities = []
    for start in range(0, len(found), batch_size):
        probabilities += cell_probabilities(policy, found[start : start + batch_size])
    return skills(found, probabilities)


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """One row per skill, one column per checkpoint (numbered; the paths listed first), the uniform reference last."""
    lines = [f"[{i}] {checkpoint}" for i, checkpoint in enumerate(results, 1)]
    first = next(iter(results.values()))
    lines.append(
        " | ".join([f"{'skill (positions)':32}", *[f"{f'[{i}]':>6}" for i in range(1, len(results) + 1)], "uniform"])
    )
    for skill in SKILLS:
        if skill in first:
            label = f"{skill} ({first[skill]['positions']})"
            cells = [f"{results[c][skill]['policy']:>6.3f}" for c in results]
            lines.append(" | ".join([f"{label:32}", *cells, f"{first[skill]['uniform']:.3f}"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="full-model checkpoint directories")
    parser.add_argument("--positions", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="", help="write the results here as JSON")
    args = parser.parse_args(argv)
    found = positions(args.positions, args.seed)
    results = {checkpoint: probe(checkpoint, found) for checkpoint in args.checkpoints}
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps({"positions": args.positions, "seed": args.seed, "results": results}))
    return results


if __name__ == "__main__":
    main()
