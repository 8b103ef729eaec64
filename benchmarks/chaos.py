"""Random kills of every part of a run, each followed by a resume when the run stopped.

`unstable train` on the demo config (the tiny model, a few learner steps, 2 inference actors, vines on, a resume state
every step), with LoRA and with full fine-tuning, is killed (`kill -9`) at random moments drawn from `--seed`, each
time in one of: the learner, the collector, an inference actor, the buffer, the pool, the tracker or the whole process
tree. Per kill it records what followed: `survived` (the run went on and logged two more learner steps: Ray restarted
the part), `stopped` (the run ended naming a cause, with the seconds it took: under 60 s is the aim), `killed` (the
whole tree) or `hung` (neither within `--hang-s`; the tree is then killed). A run that stopped or was killed is
resumed. Per run: every learner step logged once, the run finished, and its final evaluation beside an unkilled run
of the same seed.

    python benchmarks/chaos.py [--kills 30] [--steps 100] [--seed 0] [--out benchmarks/results/chaos.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from recorded import settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tictactoe-tiny.yaml"
TARGETS = {  # what is killed -> the title of its Ray process (None: the whole process tree)
    "learner": "LearnerActor",
    "collector": "CollectorActor",
    "inference actor": "InferenceServerActor",
    "buffer": "StepBufferActor",
    "pool": "ModelPoolActor",
    "tracker": "TrackerActor",
    "process tree": None,
}
KINDS = {"lora": "learner.policy.lora={lora_rank: 4, lora_alpha: 8}", "full": "learner.policy.lora=null"}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="kills in all, split over the fine-tuning kinds")
    parser.add_argument("--steps", type=int, default=100, help="learner steps of each run")
    parser.add_argument("--seed", type=int, default=0, help="draws the moments and the targets")
    parser.add_argument(
        "--hang-s", type=float, default=300.0, help="a run neither ended nor stepping this long after a kill hangs"
    )
    parser.add_argument("--run-dir", default=str(ROOT / "runs" / "chaos"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "chaos.json"))
    return parser.parse_args()


def overrides(args, kind: str, name: str) -> list[str]:
    """The run's settings over the demo config."""
    return [
        f"run.dir={args.run_dir}",
        f"run.name={name}",
        "run.seed=0",
        "warm_start=null",
        KINDS[kind],
        f"learner.num_steps={args.steps}",
        "learner.batch_size=8",
        "learner.resume_state.every_steps=1",
        "inference.num_actors=2",
        "collector.num_workers=4",
        "collector.num_eval_workers=0",
        "collector.vines.rollouts=2",
        "inference.max_new_tokens=8",
        "evaluation.games_at_start=0",
        "evaluation.games_at_end=40",
        "tracker.wandb=disabled",
        "tracker.tensorboard=false",
    ]


def start(args, kind: str, name: str, resume: bool) -> subprocess.Popen:
    """`unstable train` of the run `name` (or its resume) in a process session of its own, its output appended to
    `<run-dir>/<name>.out` and `.err` (files, not pipes: a full pipe would stall it)."""
    command = [sys.executable, "-m", "unstable.cli.main", "train"]
    if resume:
        command += ["--resume", str(Path(args.run_dir) / name)]
    else:
        command += [str(EXAMPLE), *[arg for o in overrides(args, kind, name) for arg in ("--set", o)]]
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    out, err = (open(Path(args.run_dir) / f"{name}.{suffix}", "ab") for suffix in ("out", "err"))
    run = subprocess.Popen(command, env=env, start_new_session=True, stdout=out, stderr=err)
    run.err_path = Path(err.name)
    return run


def last_error_line(run: subprocess.Popen) -> str:
    """The last line the run wrote to its error output."""
    lines = run.err_path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {run.returncode}"


def rows(run_dir: Path) -> list[dict]:
    """The run's complete rows."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    complete = []
    for line in path.read_text().splitlines():
        try:
            complete.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return complete


def finished(run_dir: Path) -> bool:
    """Whether the run wrote its final row with no stop."""
    run = rows(run_dir)
    return bool(run) and run[-1].get("final") is True and not run[-1].get("run/stopped")


def ray_process(run: subprocess.Popen, title: str) -> psutil.Process | None:
    """A live Ray process of the run (its processes descend from the driver that started Ray) whose title holds
    `title`; never another run's on the same machine."""
    for process in psutil.Process(run.pid).children(recursive=True):
        try:
            cmdline = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "ray::" in cmdline and title in cmdline:
            return process
    return None


def kill(run: subprocess.Popen, target: str) -> bool:
    """kill -9 the target's process (or the run's whole tree); whether there was one to kill."""
    title = TARGETS[target]
    if title is None:
        os.killpg(run.pid, signal.SIGKILL)
        return True
    process = ray_process(run, title)
    if process is None:
        return False
    process.kill()
    return True


def last_step(run_dir: Path) -> int:
    """The newest learner step the run logged (0: none yet)."""
    return max((r.get("learner/step", 0) for r in rows(run_dir)), default=0)


def outcome(run: subprocess.Popen, run_dir: Path, target: str, step: int, wait_s: float) -> dict:
    """What followed a kill at learner step `step`: the run ended (stopped, with its cause and seconds, or finished),
    went on (two more learner steps logged), or hung (neither within `wait_s`)."""
    if target == "process tree":
        run.wait()
        return {"outcome": "killed"}
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < wait_s:
        if run.poll() is not None:
            seconds = time.monotonic() - killed_at
            if run.returncode == 0:
                return {"outcome": "survived", "seconds": seconds}
            return {"outcome": "stopped", "seconds": seconds, "cause": last_error_line(run)}
        if last_step(run_dir) > step + 1:  # two steps on: the step in flight at the kill may still have ended
            return {"outcome": "survived", "seconds": time.monotonic() - killed_at}
        time.sleep(0.5)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    return {"outcome": "hung", "seconds": wait_s}


def wait_for_a_moment(run: subprocess.Popen, run_dir: Path, steps: int, rng: random.Random) -> str:
    """Wait for the next kill's moment, drawn from `rng`: a third of the time 3-30 s into whatever the session is
    doing (often its start: Ray, the models, the first batch), else 0-5 s after 1-3 more learner steps (or the
    last step: the final evaluation). Returns which kind of moment it was."""
    if rng.random() < 1 / 3:
        time.sleep(rng.uniform(3.0, 30.0))
        return "any"
    target = min(last_step(run_dir) + rng.randint(1, 3), steps)
    while run.poll() is None and last_step(run_dir) < target:
        time.sleep(0.5)
    time.sleep(rng.uniform(0.0, 5.0))
    return "training"


def chaos_run(args, kind: str, kills: int, rng: random.Random) -> dict:
    """One run of `kind` killed up to `kills` times at random moments, resumed after each stop, carried to its end
    (a run that ends before its kills ends with fewer)."""
    name = f"chaos-{kind}"
    run_dir = Path(args.run_dir) / name
    records, sessions, run = [], 1, start(args, kind, name, resume=False)
    while True:
        if run.poll() is not None:  # the session ended: finished, or stopped or killed and resumed
            if finished(run_dir):
                break
            run, sessions = start(args, kind, name, resume=True), sessions + 1
            continue
        if len(records) >= kills:
            run.wait()
            continue
        moment = wait_for_a_moment(run, run_dir, args.steps, rng)
        target = rng.choice(list(TARGETS))
        if run.poll() is not None or not kill(run, target):
            continue
        step = last_step(run_dir)
        record = {"target": target, "moment": moment, "step": step}
        records.append(record | outcome(run, run_dir, target, step, args.hang_s))
        print(f"  {kind} kill {len(records)}: {target} at step {step} ({moment}) -> {records[-1]}", flush=True)
    logged = [r["learner/step"] for r in rows(run_dir) if "learner/step" in r]
    return {
        "kind": kind,
        "kills": records,
        "sessions": sessions,
        "steps_logged": logged,
        "each_step_once": logged == list(range(args.steps + 1)),
        "finished": finished(run_dir),
        "eval_end": rows(run_dir)[-1].get("eval_end", {}),
    }


def reference_run(args, kind: str) -> dict:
    """The same run of `kind`, unkilled: its final evaluation."""
    name = f"reference-{kind}"
    run = start(args, kind, name, resume=False)
    run.wait()
    return rows(Path(args.run_dir) / name)[-1].get("eval_end", {})


def main() -> None:
    """Run each kind's killed run and unkilled reference, print the table, write the JSON."""
    args = parse_args()
    rng = random.Random(args.seed)
    result = {"settings": settings(args), "runs": []}
    for index, kind in enumerate(KINDS):
        kills = args.kills // len(KINDS) + (index < args.kills % len(KINDS))
        run = chaos_run(args, kind, kills, rng) | {"reference_eval_end": reference_run(args, kind)}
        result["runs"].append(run)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    kills = [k for run in result["runs"] for k in run["kills"]]
    outcomes = {o: sum(k["outcome"] == o for k in kills) for o in ("survived", "stopped", "killed", "hung")}
    result["summary"] = {
        "kills": len(kills),
        **outcomes,
        "slowest_stop_s": max((k["seconds"] for k in kills if k["outcome"] == "stopped"), default=None),
        "every_run_finished": all(run["finished"] for run in result["runs"]),
        "every_step_logged_once": all(run["each_step_once"] for run in result["runs"]),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\n{'target':<18}{'survived':>10}{'stopped':>9}{'killed':>8}{'hung':>6}")
    for target in TARGETS:
        counts = [sum(k["target"] == target and k["outcome"] == o for k in kills) for o in outcomes]
        print(f"{target:<18}" + "".join(f"{c:>{w}}" for c, w in zip(counts, (10, 9, 8, 6))))
    for run in result["runs"]:
        end, ref = run["eval_end"], run["reference_eval_end"]
        print(
            f"{run['kind']}: {run['sessions']} sessions, steps logged once: {run['each_step_once']}, finished: "
            f"{run['finished']}, final win rate {end.get('win_rate', float('nan')):.3f} "
            f"(unkilled {ref.get('win_rate', float('nan')):.3f}, {end.get('games', 0)} games each)"
        )
    print(f"summary: {result['summary']}\nwrote {args.out}")


if __name__ == "__main__":
    main()
