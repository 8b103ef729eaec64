"""One-off: the run of commit e4c85e5 evaluated only the selected checkpoint with the full evaluation; add the last
checkpoint's (the same evaluate_at, games and seeds as the benchmark's final evaluation) in the current layout."""

import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import learning as L

path = sys.argv[1]
results = json.load(open(path))
s = L.Settings(**results["settings"])
for seed, run in results["seeds"].items():
    t = run["algorithms"]["reinforce"]["tictactoe"]
    if "eval" in t.get("selected", {}):
        continue
    one = replace(s, seed=int(seed), runs_dir=f"{s.runs_dir}/seed-{seed}")
    t["selected"] = t["selected"] | {"eval": t["final"]}
    last = t["checkpoints"][str(s.rl_steps)]
    t["final"] = L.evaluate_at(L.TICTACTOE, s.model_dir, last, L.OPPONENTS[L.TICTACTOE], s.eval_games, one)
    t["curve"][-1] = L.outcome_point(s.rl_steps, t["final"], "random")
    print(seed, "last", t["final"]["opponents"]["random"]["all_seats"]["win_rate"], flush=True)
results["summary"] = {"reinforce": L.summary(results, "reinforce")}
json.dump(results, open(path, "w"), indent=2)
print(L.table(results))
