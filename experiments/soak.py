"""Soak: a long `unstable train` run of the tiny model (the demo's recipe on its two learner ranks, no warm start, no
evaluations), LoRA and full fine-tuning, sampling the run directory's disk use, the process tree's RSS and the metrics
row size every `--every` learner steps; the per-step slope of each after the first `--flat-after` steps says whether
it stays flat. Run on demand (never from tests):

    PYTHONPATH=src .venv/bin/python experiments/soak.py                  # 2,000 steps each (hours on 2 CPU cores)
    PYTHONPATH=src .venv/bin/python experiments/soak.py --smoke          # 40 steps each, sampled every 5
    PYTHONPATH=src .venv/bin/python experiments/soak.py --set learner.batch_size=4 --set collector.num_workers=4 \
        --set buffer.max_buffer_size=8                                 # the committed results (see docs)
    PYTHONPATH=src .venv/bin/python experiments/soak.py --steps 4 --every 2 --flat-after 0 --out /tmp/soak.json  # tests

`--set` overrides the demo's config in both runs (recorded in the JSON): a smaller batch makes each learner step
cheaper, so the same number of saves, checkpoints, rows and pool updates fits in less time.

Writes `--out` (default `experiments/results/soak.json`, `soak-smoke.json` with `--smoke`) and a PNG beside it, and
prints the slopes.
The probe is `benchmarks/footprint.py`'s `sample`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from footprint import sample  # noqa: E402

EXAMPLE = ROOT / "examples" / "tictactoe-tiny.yaml"
KINDS = {"lora": ["learner.policy.lora={lora_rank: 4, lora_alpha: 8}"], "full": ["learner.policy.lora=null"]}
MEASURES = ("disk_bytes", "state_bytes", "checkpoint_bytes", "rss_bytes", "row_bytes", "tables_bytes")


def learner_steps(run_dir: Path) -> int:
    """The newest learner step in `run_dir/metrics.jsonl` (-1 before the first row; a torn last line is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return -1
    steps = []
    for line in path.read_text().splitlines()[-3:]:
        try:
            steps.append(json.loads(line).get("learner/step", -1))
        except json.JSONDecodeError:  # the last line, read while the tracker writes it
            pass
    return max(steps, default=-1)


def soak(kind: str, steps: int, every: int, model_dir: str, runs: Path, extra: list[str]) -> list[dict[str, Any]]:
    """Run `steps` learner steps of `kind` in a child `unstable train` with the `extra` overrides; a sample at
    every `every`-th step."""
    overrides = [
        f"run.dir={runs}", f"run.name={kind}", f"model.path={model_dir}", "model.build_tiny_if_missing=false",
        "warm_start=null", f"learner.num_steps={steps}", "evaluation.games_at_start=0", "evaluation.games_at_end=0",
        "collector.num_eval_workers=0", "tracker.wandb=disabled", "tracker.tensorboard=false", *KINDS[kind], *extra,
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    command = [sys.executable, "-m", "unstable.cli.main", "train", str(EXAMPLE)]
    command += [arg for override in overrides for arg in ("--set", override)]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir, samples, due = runs / kind, [], every
    start = time.time()
    while child.poll() is None:
        step = learner_steps(run_dir)
        if step >= due:
            samples.append({"step": step, "seconds": time.time() - start, **sample(run_dir, psutil.Process(child.pid))})
            print(f"{kind} step {step}: {json.dumps(samples[-1])}", flush=True)
            due = (step // every + 1) * every
        time.sleep(1.0)
    if child.returncode != 0:
        raise RuntimeError(f"the {kind} run failed with status {child.returncode}")
    samples.append({"step": learner_steps(run_dir), "seconds": time.time() - start, **sample(run_dir), "end": True})
    return samples


def slope(samples: list[dict[str, Any]], key: str, after: int) -> float | None:
    """Least-squares growth of `key` per learner step over the samples after step `after` (None with < 2)."""
    points = [(s["step"], s[key]) for s in samples if s["step"] > after and not s.get("end")]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else None


def plot(results: dict[str, Any], path: Path) -> None:
    """One panel per measure, a line per kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, key in zip(axes.flat, MEASURES):
        for kind, run in results["runs"].items():
            points = [s for s in run["samples"] if not s.get("end")]
            ax.plot([s["step"] for s in points], [s[key] / 1e6 for s in points], marker="o", label=kind)
        ax.set_title(f"{key[: -len('_bytes')]} (MB)")
        ax.set_xlabel("learner step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="sample every this many learner steps")
    parser.add_argument("--flat-after", type=int, default=300, help="slopes over the samples after this step")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--smoke", action="store_true", help="40 steps, a sample every 5, slopes after step 10")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both runs, as `unstable train --set`")  # fmt: skip
    parser.add_argument("--out", type=Path, help="the JSON to write, the PNG beside it (default: results/soak.json)")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.every, args.flat_after = 40, 5, 10
    from unstable.models.tiny import ensure_tiny_model

    model_dir = str(ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3"))
    results: dict[str, Any] = {
        "steps": args.steps, "every": args.every, "flat_after": args.flat_after, "overrides": args.overrides,
        "command": " ".join(["python", *sys.argv]), "machine": {"cpus": os.cpu_count()}, "runs": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            samples = soak(kind, args.steps, args.every, model_dir, Path(tmp), args.overrides)
            slopes = {key: slope(samples, key, args.flat_after) for key in MEASURES}
            results["runs"][kind] = {"samples": samples, "slope_per_step": slopes}
    out = args.out or ROOT / "experiments" / "results" / ("soak-smoke.json" if args.smoke else "soak.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    print(f"per-step slope after step {args.flat_after} (bytes per learner step):")
    for kind, run in results["runs"].items():
        print(f"  {kind}: " + ", ".join(f"{k} {v:+.0f}" for k, v in run["slope_per_step"].items() if v is not None))
    print(f"wrote {out} and {out.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
