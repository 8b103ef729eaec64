"""Pacing on or off: learning per wall-clock second on the demo's recipe, from one shared warm start.

Makes the demo's warm start once (`unstable train examples/tictactoe-tiny.yaml` with one learner step and no
evaluation; its warm-start checkpoint is the shared start), then runs the demo's RL from it with
`collector.pacing` true and false, interleaved (on, off, on, off, ...), one run at a time, one pair per seed:

    unstable train examples/tictactoe-tiny.yaml --set warm_start=null --set model.path=<warm start>
        --set learner.num_steps=N --set evaluation.games_at_start=0 --set evaluation.games_at_end=E
        --set tracker.wandb=disabled --set run.seed=S --set collector.pacing=P

Records per run: the final evaluation's win rate against `random` with its Wilson 95% interval, whole-process wall
seconds, RL seconds (row 0 to the last learner row), steps added and dropped by the StepBuffer, games held back,
mean staleness and learner seconds per update. Writes the JSON to `--out` and prints a table.

    .venv/bin/python experiments/pacing.py            # 3 seeds x 200 steps, 600 evaluation games
    .venv/bin/python experiments/pacing.py --smoke    # 1 seed x 2 small steps, 20 evaluation games, a tiny warm start
    .venv/bin/python experiments/pacing.py --smoke --start MODEL   # the same, RL from MODEL: no warm start
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kill_soak import ENV, EXAMPLE, ROOT  # the child runs' environment, the demo's config

from unstable.tracking import keys


def train(*sets: str) -> float:
    """Run `unstable train` on the demo config with `sets` as `--set` overrides; returns its wall seconds."""
    command = [sys.executable, "-m", "unstable.cli.main", "train", str(EXAMPLE)]
    command += [arg for s in sets for arg in ("--set", s)]
    start = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=os.environ | ENV, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def warm_start(work: Path, model: str, smoke: bool) -> str:
    """The demo's warm start, made once under `work/warm`: the path of its checkpoint."""
    found = sorted((work / "warm" / "warm-start" / "checkpoints").glob("*/config.json"))
    if not found:
        small = ["warm_start.games=40", "warm_start.epochs=1"] if smoke else []
        common = [f"run.dir={work}", "run.name=warm", f"model.path={model}", "learner.num_steps=1"]
        train(*common, "evaluation.games_at_start=0", "evaluation.games_at_end=0", *NO_SINKS, *small)
        found = sorted((work / "warm" / "warm-start" / "checkpoints").glob("*/config.json"))
    return str(found[-1].parent)


NO_SINKS = ("tracker.wandb=disabled", "tracker.tensorboard=false")
# --smoke: the demo's proportions cut down (8 games in flight, batches of 8 in a buffer of 2 batches, one learner rank)
SMOKE_SIZES = ("collector.num_workers=8", "learner.batch_size=8", "buffer.max_buffer_size=16", "learner.num_learners=1")


def measure(
    work: Path, start: str, seed: int, pacing: bool, steps: int, eval_games: int, sizes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One RL run from the warm start `start`, `sizes` as its last overrides: its figures (see the module
    docstring)."""
    name = f"seed{seed}-{'pacing' if pacing else 'nopacing'}"
    wall = train(
        f"run.dir={work}",
        f"run.name={name}",
        "warm_start=null",
        f"model.path={start}",
        f"learner.num_steps={steps}",
        "evaluation.games_at_start=0",
        f"evaluation.games_at_end={eval_games}",
        f"run.seed={seed}",
        f"collector.pacing={str(pacing).lower()}",
        *NO_SINKS,
        *sizes,
    )
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    learner = [r for r in rows if keys.UPDATE_SECONDS in r]
    final = rows[-1]
    return {
        "seed": seed,
        "pacing": pacing,
        "win_rate": final["eval_end"]["win_rate"],
        "win_ci": final["eval_end"]["win_ci"],
        "eval_games": final["eval_end"]["games"],
        "wall_s": wall,
        "rl_s": learner[-1][keys.TIME] - rows[0][keys.TIME],
        "steps_added": final[keys.BUFFER_STEPS_ADDED],
        "steps_dropped": final[keys.BUFFER_STEPS_DROPPED],
        "games_held_back": final.get(keys.GAMES_HELD_BACK, 0),
        "staleness_mean": statistics.fmean(r[keys.STALENESS_MEAN] for r in learner),
        "learner_s_per_step": statistics.fmean(r[keys.UPDATE_SECONDS] for r in learner),
        "learner_wait_s_per_step": statistics.fmean(r[keys.WAIT_SECONDS] for r in learner),
    }


def table(runs: list[dict[str, Any]]) -> str:
    """The runs as a Markdown table."""
    lines = [
        "| seed | pacing | win vs random (95% CI) | wall s | RL s | steps added | dropped | held back | staleness "
        "| learner s/step | wait s/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        low, high = r["win_ci"]
        lines.append(
            f"| {r['seed']} | {'on' if r['pacing'] else 'off'} | {r['win_rate']:.3f} ({low:.3f}-{high:.3f}) "
            f"| {r['wall_s']:.0f} | {r['rl_s']:.0f} | {r['steps_added']:,} | {r['steps_dropped']:,} "
            f"| {r['games_held_back']:,} | {r['staleness_mean']:.2f} | {r['learner_s_per_step']:.2f} "
            f"| {r['learner_wait_s_per_step']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Parse the options, run the pairs, write the JSON and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="1 seed, 2 steps of 8 samples, 20 evaluation games")
    parser.add_argument("--steps", type=int, default=200, help="learner steps per run")
    parser.add_argument("--eval-games", type=int, default=600, help="final evaluation games per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "pacing-bench", help="run directories")
    parser.add_argument("--model", default=str(ROOT / ".cache" / "tiny-qwen3"), help="the demo's base model")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "pacing.json")
    parser.add_argument("--start", help="RL from this model instead of the demo's warm start (a quick check)")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.eval_games, args.seeds = 2, 20, args.seeds[:1]
    args.work.mkdir(parents=True, exist_ok=True)
    start = args.start or warm_start(args.work, args.model, args.smoke)
    runs: list[dict[str, Any]] = []
    sizes = SMOKE_SIZES if args.smoke else ()
    for seed in args.seeds:
        for pacing in (True, False):
            runs.append(measure(args.work, start, seed, pacing, args.steps, args.eval_games, sizes))
            runs[-1]["load_average"] = os.getloadavg()[0]  # the machine's 1-minute load when the run ended
            print(table(runs[-1:]).splitlines()[-1], flush=True)
            if not args.smoke:  # after every run, so an interrupted benchmark keeps what it measured
                write(args, runs)
    print(table(runs))


def write(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The JSON of the runs so far to `args.out`."""
    result = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "steps": args.steps,
        "eval_games": args.eval_games,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
