"""What a TicTacToe checkpoint has learned, skill by skill, scored exactly rather than by playing games.

At positions from random play, every cell's move is scored as a completion with the learner's forward pass (as
Kuhn Poker's exact exploitability is, `evaluate.kuhn_exploitability`) and the nine scores are renormalised into the
policy's choice of cell. Each skill is the mean mass on its cells, beside what a uniform choice among the empty
cells would give:

- occupied: the mass on taken cells (moves the env rejects), over all positions;
- win: the mass on the cells that win at once, where there is one; also split by the kind of line the winning
  cell completes (row, column, diagonal: positions with one winning cell, on one line);
- block: the mass on the cells that stop the opponent's immediate win, where there is one and no win;
- center: the mass on the center on the empty board.

`unstable eval --model CKPT --env TicTacToe-v0 --probe 800` adds it to the report; `benchmarks/tictactoe_probe.py`
sets several checkpoints side by side.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

from unstable.collector.demonstrations import supervised_step
from unstable.games import tictactoe
from unstable.games.registry import make_env
from unstable.learner import PolicyModel
from unstable.records import EnvSpec, Step

SKILLS = [
    "occupied",
    "win",
    "win on a row",
    "win on a column",
    "win on a diagonal",
    "block",
    "center on the empty board",
]
Position = tuple[str, str]  # the observation of the player to move, its board (`unstable.games.tictactoe`)
Skills = dict[str, dict[str, float]]  # skill -> policy mass, uniform mass, positions


def is_tictactoe(spec: EnvSpec) -> bool:
    """True for TextArena's TicTacToe envs, the games the probe reads."""
    return spec.env_id.startswith("TicTacToe-")


def probe_positions(env_id: str, count: int, seed: int) -> list[Position]:
    """`count` positions (every turn of random-vs-random games of `env_id`, until there are enough)."""
    rng = random.Random(seed)
    found: list[Position] = []
    while len(found) < count:
        env = make_env(env_id)
        env.reset(num_players=2, seed=rng.randrange(2**31))
        done = False
        while not done and len(found) < count:
            observation = env.get_observation()[1]
            board = tictactoe.read_board(observation)
            found.append((observation, board))
            done, _ = env.step(f"[{rng.choice(tictactoe.empty_cells(board))}]")
    return found


def cell_probabilities(policy: PolicyModel, spec: EnvSpec, batch: list[Position]) -> list[list[float]]:
    """The policy's probability of each of the nine cells at each position (renormalised over the nine)."""
    steps = [
        supervised_step(
            Step(spec.env_id, tictactoe.MARKS.index(tictactoe.to_move(board)), 0, observation, f"[{cell}]"),
            spec,
            policy.tokenizer,
        )
        for observation, board in batch
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


def skills(found: list[Position], probabilities: list[list[float]]) -> Skills:
    """Mean mass on each skill's cells, with the uniform-choice reference and the number of positions."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # policy mass, uniform mass, positions

    def add(skill: str, cells: list[int], p: list[float], empty: list[int]) -> None:
        entry = sums[skill]
        entry[0] += sum(p[c] for c in cells)
        entry[1] += sum(c in empty for c in cells) / len(empty)
        entry[2] += 1

    for (_, board), p in zip(found, probabilities):
        empty, mark = tictactoe.empty_cells(board), tictactoe.to_move(board)
        add("occupied", [c for c in range(9) if c not in empty], p, empty)
        wins, blocks = tictactoe.winning_cells(board, mark), tictactoe.blocking_cells(board, mark)
        if wins:
            add("win", wins, p, empty)
            lines = tictactoe.completing_lines(board, mark, wins[0])
            if len(wins) == 1 and len(lines) == 1:
                add(f"win on a {tictactoe.line_kind(lines[0])}", wins, p, empty)
        elif blocks:
            add("block", blocks, p, empty)
        if len(empty) == 9:
            add("center on the empty board", [tictactoe.CENTER], p, empty)
    return {k: {"policy": m / n, "uniform": u / n, "positions": n} for k, (m, u, n) in sums.items()}


def probe(policy: PolicyModel, spec: EnvSpec, found: list[Position], batch_size: int = 16) -> Skills:
    """`skills` of the loaded `policy` (`evaluate.scoring_policy`) over the positions `found`."""
    probabilities = []
    for start in range(0, len(found), batch_size):
        probabilities += cell_probabilities(policy, spec, found[start : start + batch_size])
    return skills(found, probabilities)


def format_probe(results: dict[str, Skills]) -> str:
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


def probe_report(policy: PolicyModel, spec: EnvSpec, positions: int, seed: int) -> dict[str, Any]:
    """The probe of `policy` at `positions` positions drawn with `seed`, JSON-ready: what `unstable eval --probe`
    adds to its report."""
    found = probe_positions(spec.env_id, positions, seed)
    return {"positions": positions, "seed": seed, "skills": probe(policy, spec, found)}
