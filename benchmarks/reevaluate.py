"""Evaluate a finished learning run again: each seed's TicTacToe warm start and last checkpoint, with more games
or another sampling temperature (0: greedy, the policy's most likely move), against random and minimax.

Reads `<results>/learning.json` (written by `benchmarks/learning.py`; its checkpoints must still be on disk), writes
`<results>/reeval-<games>-t<temperature>.json` and prints the per-seed table:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/reevaluate.py benchmarks/results/recipe-cosine --games 400
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/reevaluate.py benchmarks/results/recipe-cosine --temperature 0
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import learning as L  # noqa: E402


def reevaluate(results_dir: Path, games: int, temperature: float) -> dict:
    """Every seed's warm start and last checkpoint evaluated with `games` games per opponent at `temperature`."""
    results = json.loads((results_dir / "learning.json").read_text())
    settings = replace(L.Settings(**results["settings"]), eval_games=games, temperature=temperature)
    out = {"games": games, "temperature": temperature, "seeds": {}}
    for seed, run in results["seeds"].items():
        one = replace(settings, seed=int(seed))
        checkpoints = run["algorithms"]["reinforce"]["tictactoe"]["checkpoints"]
        opponents = L.OPPONENTS[L.TICTACTOE]
        row = {}
        for name, step in (("warm_start", "0"), ("after_rl", str(settings.rl_steps))):
            report = L.evaluate_at(L.TICTACTOE, settings.model_dir, checkpoints[step], opponents, games, one)
            row[name] = {o: report["opponents"][o]["all_seats"] for o in opponents}
        row["separated"] = L.separated(row["warm_start"]["random"], row["after_rl"]["random"])
        out["seeds"][seed] = row
        print(_line(seed, row), flush=True)
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
    parser.add_argument("results_dir", type=Path, help="a --out-dir of benchmarks/learning.py")
    parser.add_argument("--games", type=int, default=400, help="games per opponent (default 400)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 greedy (default 1)")
    args = parser.parse_args()
    out = reevaluate(args.results_dir, args.games, args.temperature)
    path = args.results_dir / f"reeval-{args.games}-t{args.temperature:g}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
