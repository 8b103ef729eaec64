"""Evaluate a finished learning run again: each TicTacToe seed's warm start and last checkpoint, with more games
or another sampling temperature (0: greedy, the policy's most likely move), against random and minimax.

Reads `<results>/learning.json` (written by `benchmarks/learning.py` since recipes became config files; its
checkpoints must still be on disk), writes `<results>/reeval-<games>-t<temperature>.json` and prints the per-seed
table:

    python benchmarks/reevaluate.py benchmarks/results/learning --games 400
    python benchmarks/reevaluate.py benchmarks/results/learning --temperature 0
    python benchmarks/reevaluate.py /tmp/learning --games 2 --out /tmp/reeval.json   # the smoke run's (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import learning as L  # noqa: E402


def reevaluate(results_dir: Path, games: int, temperature: float) -> dict:
    """Every TicTacToe seed's warm start and last checkpoint evaluated with `games` games per opponent at
    `temperature`, with each recipe's settings as the run had them."""
    results = json.loads((results_dir / "learning.json").read_text())
    settings = argparse.Namespace(**results["settings"])
    out = {"games": games, "temperature": temperature, "seeds": {}}
    opponents = L.OPPONENTS["TicTacToe"]
    for name, recipe in results["recipes"].items():
        for seed, run in recipe["seeds"].items():
            if run["game"] != "TicTacToe":
                continue
            cfg = L.recipe_config(Path(recipe["path"]), int(seed), settings)
            cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"temperature": temperature})})
            last = str(cfg.learner.num_steps)
            row = {}
            for label, step in (("warm_start", "0"), ("after_rl", last)):
                report = L.evaluate_at(cfg, run["checkpoints"][step], opponents, games, os.cpu_count() or 1)
                row[label] = {o: report["opponents"][o]["all_seats"] for o in opponents}
            row["separated"] = L.separated(row["warm_start"]["random"], row["after_rl"]["random"])
            out["seeds"][f"{name}/{seed}"] = row
            print(_line(f"{name}/{seed}", row), flush=True)
    return out


def _line(seed: str, row: dict) -> str:
    """One seed's win rate vs random and non-loss vs minimax, warm start -> after RL."""
    before, after = row["warm_start"], row["after_rl"]
    win = f"{L.rate_text(before['random'])} -> {L.rate_text(after['random'])}"
    minimax = "tictactoe-minimax"
    non_loss = f"{L.rate_text(before[minimax], 'non-loss')} -> {L.rate_text(after[minimax], 'non-loss')}"
    return f"seed {seed}: win vs random {win} separated={row['separated']}; non-loss vs minimax {non_loss}"


def main() -> None:
    """Parse the flags, re-evaluate, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path, help="an --out of benchmarks/learning.py")
    parser.add_argument("--games", type=int, default=400, help="games per opponent (default 400)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 greedy (default 1)")
    parser.add_argument("--out", type=Path, help="where to write (default: RESULTS_DIR/reeval-GAMES-tT.json)")
    args = parser.parse_args()
    out = reevaluate(args.results_dir, args.games, args.temperature)
    path = args.out or args.results_dir / f"reeval-{args.games}-t{args.temperature:g}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
