"""The TicTacToe skill probe (`unstable.evaluation.probe`) of several checkpoints, side by side on the same positions.

`unstable eval --model CKPT --env TicTacToe-v0 --probe 800` probes one checkpoint beside its games; this sets
full-model checkpoints in columns of one table, e.g. a warm start against its RL run, writes `--out` (JSON) and
prints the table:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/tictactoe_probe.py \\
        runs/ws/seed-0/sft-TicTacToe-v0-train/checkpoints/ckpt-770 \\
        runs/x-vsrandom/seed-0/rl-TicTacToe-v0-train-reinforce/checkpoints/ckpt-200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from unstable.evaluation.evaluate import scoring_policy
from unstable.evaluation.probe import format_probe, probe, probe_positions
from unstable.records import EnvSpec

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="full-model checkpoint directories")
    parser.add_argument("--positions", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="", help="write the results here as JSON")
    args = parser.parse_args()
    found = probe_positions(TICTACTOE.env_id, args.positions, args.seed)
    results = {checkpoint: probe(scoring_policy(checkpoint), TICTACTOE, found) for checkpoint in args.checkpoints}
    print(format_probe(results))
    if args.out:
        Path(args.out).write_text(json.dumps({"positions": args.positions, "seed": args.seed, "results": results}))


if __name__ == "__main__":
    main()
