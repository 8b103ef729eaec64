"""Kill soak: a run killed with SIGKILL at random moments of every phase, warm start and evaluations included, and
resumed each time, ends as an unkilled run of the same seed does.

Runs a small cut of the demo config through `unstable train` in subprocesses: first once unkilled (the
reference, which also times each phase), then again, killing each session's process group at a random moment of
a planned phase (`PLAN`: the warm start, the Ray start and initial evaluation, RL, the final evaluation) and
resuming with `unstable train --resume`, until the run finishes; then resumes the finished run once more. Checks:
the run finishes, every learner step is in `metrics.jsonl` once, the redone warm start is the reference's bit for
bit, the finished run's resume does nothing, and the final evaluation is within noise of the unkilled runs'.
Noise: two unkilled runs of one seed differ too (the games run concurrently, so which steps make each batch
varies), so `--references` unkilled runs (default 2) are made; the killed run's final win rate is within noise when
a two-proportion z-test against the references' pooled games gives p >= 0.05, and the references' own p (one
against the other) says how far apart two unkilled runs land. Writes the JSON to `--out` and prints a table.

Run on demand (never from tests); the machine's load only changes the timings:

    .venv/bin/python experiments/kill_soak.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import load_file

from unstable.tracking import keys, wilson_interval

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tictactoe-tiny.yaml"
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
    "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
}
PHASES = ("warm start", "initial eval", "rl", "final eval")
# one kill per entry, in order: twice in the warm start (the second kill hits the redo), twice before row 0, five
# times in RL, twice in the final evaluation
PLAN = ["warm start"] * 2 + ["initial eval"] * 2 + ["rl"] * 5 + ["final eval"] * 2


class Session:
    """One `unstable train` process in its own process group; a thread stamps each line of its output."""

    def __init__(self, args: list[str]):
        command = [sys.executable, "-m", "unstable.cli.main", "train", *args]
        self.start = time.time()
        self.process = subprocess.Popen(
            command,
            env=os.environ | ENV,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time() - self.start, line.rstrip("\n")))

    def first(self, predicate) -> float | None:
        """Seconds into the session of the first output line that `predicate` accepts, None if none yet."""
        return next((t for t, line in list(self.lines) if predicate(line)), None)

    def kill(self) -> None:
        """SIGKILL the driver and every Ray process it started."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.wait()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process and its output; returns the exit status."""
        rc = self.process.wait(timeout)
        self.reader.join()
        return rc

    def output(self) -> str:
        """Everything the session printed."""
        return "\n".join(line for _, line in self.lines)


def _warm_epoch_line(epochs: int):
    return lambda line: line.startswith(f"warm start epoch {epochs}:")


def _step_line(step: int | None, total: int):
    return lambda line: line.startswith("step ") and (step is None or line.split()[1] == f"{step}/{total}")


def phase_starts(session: Session, epochs: int, total: int) -> dict[str, float | None]:
    """When each phase began in `session` (seconds in): None for a phase not (yet) reached."""
    banner = session.first(lambda line: line.startswith("unstable: warm start"))
    # printed after the warm start's banner: with none above it, the session starts Ray at once
    launched = session.first(lambda line: line.startswith(("unstable: resuming", "unstable: training")))
    no_warm_start = 0.0 if launched is not None else None
    return {
        "warm start": banner,
        "initial eval": session.first(_warm_epoch_line(epochs)) if banner is not None else no_warm_start,
        "rl": session.first(_step_line(None, total)),
        "final eval": session.first(_step_line(total, total)),
    }


def run_reference(args: list[str], epochs: int, total: int) -> dict[str, Any]:
    """Run unkilled; returns its wall time and how long each phase took."""
    session = Session(args)
    rc = session.wait()
    assert rc == 0, session.output()[-3000:]
    starts = phase_starts(session, epochs, total)
    end = session.first(lambda line: line.startswith("=== summary ==="))
    edges = [starts[p] for p in PHASES] + [end]
    return {
        "wall_s": time.time() - session.start,
        "phase_s": {p: edges[i + 1] - edges[i] for i, p in enumerate(PHASES)},
    }


def where(run_dir: Path, total: int) -> str:
    """The moment a killed run stopped at, read from its files."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    if config["warm_start"] is not None:
        return "warm start (not recorded done)"
    rows = _rows(run_dir)
    steps = [r[keys.STEP] for r in rows if keys.STEP in r]
    pointer = run_dir / "state" / "latest.json"
    saved = json.loads(pointer.read_text())["step"] if pointer.exists() else None
    if saved is None:
        return "before row 0's state" if steps else "warm start done, no row 0 (Ray start / initial eval)"
    if saved < total:
        return f"rl (state {saved}, rows to {max(steps)})"
    return "after the summary" if rows and rows[-1].get("final") else "final eval"


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line torn by the kill
    return rows


def phase_of(stopped_at: str) -> str:
    """The phase a session resumed from a run stopped at `stopped_at` (a `where` answer) starts in."""
    for start, phase in (("warm start", "warm start"), ("rl", "rl"), ("final", "final eval"), ("after", "done")):
        if stopped_at.startswith(start):
            return phase
    return "initial eval"


def kill_at_end(session: Session, collector_log: Path, lines_before: int, ref: dict[str, Any], rng: random.Random):
    """Kill a session resumed with every step done (it prints nothing until its summary) at a random moment of
    its final evaluation: once its collector is up (it logs its sampling seeds), within half the reference's."""
    while session.process.poll() is None and _line_count(collector_log) <= lines_before:
        time.sleep(0.05)
    up = time.time()
    delay = rng.uniform(0.05, 0.5) * ref["phase_s"]["final eval"]
    while time.time() < up + delay and session.process.poll() is None:
        time.sleep(0.05)
    if session.process.poll() is not None:
        return None
    session.kill()
    return "final eval", round(delay, 2)


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_in(phase: str, session: Session, ref: dict[str, Any], rng: random.Random, epochs: int, total: int):
    """Wait for `phase` to start in `session` (or a later one), kill at a random moment of its reference length;
    returns (phase hit, seconds into it), or None when the session ended first."""
    while session.process.poll() is None:
        starts = phase_starts(session, epochs, total)
        reached = [p for p in PHASES[PHASES.index(phase) :] if starts[p] is not None]
        later = [p for p in reached if p != phase]
        if reached:
            target = reached[-1] if later else phase
            # the first half of the reference's length: the machine's load can make this session's phase shorter
            delay = rng.uniform(0.05, 0.5) * ref["phase_s"][target]
            if target == "rl":  # a resumed session's RL phase is the steps left
                done = sum(1 for _, line in session.lines if _step_line(None, total)(line))
                delay *= max(total - done, 1) / total
            deadline = session.start + starts[target] + delay
            following = PHASES[PHASES.index(target) + 1 :]
            while time.time() < deadline and session.process.poll() is None:
                if any(phase_starts(session, epochs, total)[p] is not None for p in following):
                    break  # the phase ended early: kill at once (the table says where the run stopped)
                time.sleep(0.05)
            if session.process.poll() is not None:
                return None
            session.kill()
            return target, round(delay, 2)
        time.sleep(0.1)
    return None


def two_proportion_p(wins_a: int, n_a: int, wins_b: int, n_b: int) -> float:
    """Two-sided p-value of the z-test that two win rates are equal."""
    pooled = (wins_a + wins_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = 0.0 if se == 0 else (wins_a / n_a - wins_b / n_b) / se
    return math.erfc(abs(z) / math.sqrt(2))


def final_eval(run_dir: Path) -> dict[str, Any]:
    """The final row's end-of-run evaluation: wins, games and the Wilson interval."""
    table = _rows(run_dir)[-1]["eval_end"]
    wins = round(table["win_rate"] * table["games"])
    return {
        "wins": wins,
        "games": table["games"],
        "win_rate": table["win_rate"],
        "ci": wilson_interval(wins, table["games"]),
    }


def same_warm_start(a: Path, b: Path) -> bool:
    """Whether the two runs' warm-start checkpoints hold equal weights, bit for bit."""
    files = [sorted((d / "warm-start" / "checkpoints").glob("ckpt-*/model.safetensors")) for d in (a, b)]
    if not all(files):
        return False
    x, y = load_file(files[0][-1]), load_file(files[1][-1])
    return x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The soak's size and where it writes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="learner steps of the run")
    parser.add_argument("--eval-games", type=int, default=200, help="evaluation games at the start and the end")
    parser.add_argument("--warm-games", type=int, default=50, help="warm-start games")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (also draws the kill moments)")
    parser.add_argument("--references", type=int, default=2, help="unkilled runs of the same seed (>= 2: noise)")
    parser.add_argument("--runs-dir", default="runs/kill-soak", help="where the runs go (emptied first)")
    parser.add_argument("--out", default="experiments/results/kill_soak.json")
    return parser.parse_args(argv)


def overrides(a: argparse.Namespace, name: str) -> list[str]:
    """`--set` arguments: the demo config cut to a few minutes on a shared 2-core machine."""
    sets = [
        f"run.dir={a.runs_dir}",
        f"run.name={name}",
        f"run.seed={a.seed}",
        f"learner.num_steps={a.steps}",
        "learner.batch_size=16",
        "collector.num_workers=8",
        f"warm_start.games={a.warm_games}",
        f"evaluation.games_at_start={a.eval_games}",
        f"evaluation.games_at_end={a.eval_games}",
        "tracker.wandb=disabled",
        "tracker.tensorboard=false",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the reference and the killed run, check them, write the JSON and print the table."""
    a = parse_args(argv)
    rng = random.Random(a.seed)
    runs = ROOT / a.runs_dir
    shutil.rmtree(runs, ignore_errors=True)
    epochs = yaml.safe_load(EXAMPLE.read_text())["warm_start"]["epochs"]
    start = time.time()
    names = ["reference"] + [f"reference-{i}" for i in range(2, a.references + 1)]
    references = [run_reference([str(EXAMPLE), *overrides(a, name)], epochs, a.steps) for name in names]
    ref = references[0]
    for name, r in zip(names, references):
        print(f"{name}: {r['wall_s']:.0f}s, phases {r['phase_s']}", flush=True)

    killed_dir, kills, ended = runs / "killed", [], []  # ended: sessions that stopped before their planned kill
    args = [str(EXAMPLE), *overrides(a, "killed")]
    for planned in PLAN:
        now = phase_of(where(killed_dir, a.steps)) if kills else "warm start"
        if now == "done":
            break
        planned = max(planned, now, key=PHASES.index)  # a run past the planned phase is killed where it is
        collector_log = killed_dir / "logs" / "collector.log"
        lines_before = _line_count(collector_log)
        session = Session(args)
        if planned == "final eval" and now == "final eval":
            hit = kill_at_end(session, collector_log, lines_before, ref, rng)
        else:
            hit = kill_in(planned, session, ref, rng, epochs, a.steps)
        if hit is None:
            rc = session.wait()
            ended.append({"planned": planned, "exit": rc, "output_tail": session.output()[-2000:]})
            print(f"  session ended before the kill planned in {planned}: exit {rc}", flush=True)
            args = ["--resume", str(killed_dir)]
            continue
        kills.append({"planned": planned, "phase": hit[0], "after_s": hit[1], "stopped_at": where(killed_dir, a.steps)})
        print(f"  kill {len(kills):2d}: {kills[-1]}", flush=True)
        args = ["--resume", str(killed_dir)]
    last = Session(args)
    finished_rc = last.wait()
    rows_before = (killed_dir / "metrics.jsonl").read_text()
    again = Session(["--resume", str(killed_dir)])
    again_rc = again.wait()

    steps = [r[keys.STEP] for r in _rows(killed_dir) if keys.STEP in r]
    ends, end_killed = [final_eval(runs / name) for name in names], final_eval(killed_dir)
    pooled = {"wins": sum(e["wins"] for e in ends), "games": sum(e["games"] for e in ends)}
    p = two_proportion_p(pooled["wins"], pooled["games"], end_killed["wins"], end_killed["games"])
    p_references = two_proportion_p(ends[0]["wins"], ends[0]["games"], ends[-1]["wins"], ends[-1]["games"])
    checks = {
        "finished": finished_rc == 0 and _rows(killed_dir)[-1].get("final") is True,
        "every_step_logged_once": steps == list(range(a.steps + 1)),
        "warm_start_redone_bit_for_bit": same_warm_start(runs / "reference", killed_dir),
        "finished_resume_does_nothing": again_rc == 0
        and "is finished" in again.output()
        and (killed_dir / "metrics.jsonl").read_text() == rows_before,
        "final_eval_within_noise": p >= 0.05,
        "kills": len(kills) >= 10,
        "phases_hit": sorted({k["phase"] for k in kills}) == sorted(PHASES),
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "settings": vars(a) | {"plan": PLAN},
        "references": references,
        "kills": kills,
        "sessions_ended_unkilled": ended,
        "final_eval": {
            "references": ends,
            "killed": end_killed,
            "p_killed_vs_references": p,
            "p_between_references": p_references if len(ends) > 1 else None,
        },
        "checks": checks,
        "wall_seconds": time.time() - start,
    }
    out = ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    """The kills and checks as text."""
    lines = [f"{'#':>2}  {'planned':<13}{'killed in':<13}{'after':>7}  stopped at"]
    for i, k in enumerate(result["kills"], 1):
        lines.append(f"{i:>2}  {k['planned']:<13}{k['phase']:<13}{k['after_s']:>6.1f}s  {k['stopped_at']}")
    ev = result["final_eval"]
    named = [(f"reference {i}", e) for i, e in enumerate(ev["references"], 1)] + [("killed", ev["killed"])]
    for name, e in named:
        lines.append(
            f"final eval {name:<11}: win {e['win_rate']:.3f} [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}] of {e['games']}"
        )
    between = ev["p_between_references"]
    lines.append(
        f"two-proportion p: killed vs the references pooled {ev['p_killed_vs_references']:.3f}"
        + (f", reference 1 vs {len(ev['references'])} {between:.3f}" if between is not None else "")
    )
    lines += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in result["checks"].items()]
    lines.append(f"wall: {result['wall_seconds']:.0f}s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if all(main()["checks"].values()) else 1)
