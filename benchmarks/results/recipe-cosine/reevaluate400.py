"""One-off: each seed's warm start and step-200 checkpoint of this run evaluated again with 400 games against
random and minimax (the benchmark's evaluate_at; game seeds seed + i), for intervals half as wide as 200 games give.
Writes reeval-400.json beside this file and prints the per-seed table."""

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, "benchmarks")
import learning as L  # noqa: E402

here = Path(__file__).parent
results = json.load(open(here / "learning.json"))
s = replace(L.Settings(**results["settings"]), eval_games=400)
out = {"games": s.eval_games, "seeds": {}}
for seed, run in results["seeds"].items():
    one = replace(s, seed=int(seed))
    t = run["algorithms"]["reinforce"]["tictactoe"]
    row = {}
    for name, checkpoint in (("warm_start", t["checkpoints"]["0"]), ("after_rl", t["checkpoints"][str(s.rl_steps)])):
        report = L.evaluate_at(L.TICTACTOE, s.model_dir, checkpoint, L.OPPONENTS[L.TICTACTOE], s.eval_games, one)
        row[name] = {o: report["opponents"][o]["all_seats"] for o in L.OPPONENTS[L.TICTACTOE]}
    before, after = row["warm_start"]["random"], row["after_rl"]["random"]
    row["separated"] = after["win_ci"][0] > before["win_ci"][1]
    out["seeds"][seed] = row
    print(
        f"seed {seed}: {before['win_rate']:.3f} {before['win_ci']} -> {after['win_rate']:.3f} {after['win_ci']}"
        f" separated={row['separated']}",
        flush=True,
    )
json.dump(out, open(here / "reeval-400.json", "w"), indent=2)
