"""Every benchmark and experiment script runs: each script of `benchmarks/` and `experiments/` with its smallest
settings, in its own process (a fork of one that has imported torch and the package: tests/zygote.py), writing into
a temporary directory (never over `benchmarks/results/` or `experiments/results/`). The numbers mean nothing; that
each script still runs against the package as it is does (`benchmarks/loop.py` broke unnoticed when the demo config
changed under it).

A new script needs a row in `SMOKES`, or in `NOT_HERE` with the reason.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from .zygote import run_python

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("benchmarks", "experiments")  # the scripts at the top of each
TINY = "{tiny}"  # the session's tiny model directory
TMP = "{tmp}"  # the test's temporary directory
# script (its path in the repository): (its smallest command line, the file it must write or None, what its output
# must say)
SMOKES = {
    "benchmarks/cartpole.py": (["--smoke", "--out", f"{TMP}/cartpole.json"], "cartpole.json", "seeds reached"),
    "benchmarks/pendulum.py": (["--smoke", "--out", f"{TMP}/pendulum.json"], "pendulum.json", "wrote"),
    "experiments/engine_ab.py": (["--smoke", "--out", f"{TMP}/engine_ab.json"], "engine_ab.json", "tok/s before"),
    "experiments/decode_profile.py": (
        ["--model", TINY, "--batches", "1", "2", "--steps", "2", "--out", f"{TMP}/decode_profile.json"],
        "decode_profile.json",
        "engine_ms",
    ),
    "experiments/decode_attention.py": (  # the eager ways: compiling on the CPU is most of the script's time there
        ["--smoke", "--ways", "sdpa_slot_major", "matmul_head_major", "--out", f"{TMP}/attention.json"],
        "attention.json",
        "us/layer",
    ),
    "experiments/loop_gap.py": (
        ["--smoke", "--model", TINY, "--rounds", "1", "--out", f"{TMP}/loop_gap.json"],
        "loop_gap.json",
        "beside a learner",
    ),
    "experiments/resume_state_cost.py": (
        ["--steps", "3", "--repeats", "1", "--out", f"{TMP}/resume_state_cost.json"],
        "resume_state_cost.json",
        "s/step",
    ),
    "benchmarks/demo.py": (
        ["--runs", "1", "--work", f"{TMP}/runs", "--out", f"{TMP}/demo.json"]
        + [f"--set={o}" for o in (f"model.path={TINY}", "model.build_tiny_if_missing=false", "warm_start=null")]
        + [f"--set={o}" for o in ("learner.num_steps=2", "learner.num_learners=1", "learner.batch_size=4")]
        + [f"--set={o}" for o in ("collector.num_workers=2", "inference.max_new_tokens=4", "tracker.tensorboard=false")]
        + ["--set=evaluation.games_at_start=2", "--set=evaluation.games_at_end=2"],
        "demo.json",
        "end win rate",
    ),
    "benchmarks/inference.py": ([f"{TMP}/inference.json", "--max-new-tokens", "2"], "inference.json", "transformers"),
    "benchmarks/loop.py": (
        ["--steps", "3", "--workers", "2", "--batch-size", "4", "--max-new-tokens", "4", "--bare-rounds", "1"]
        + ["--scaling", "2", "2", "--run-dir", f"{TMP}/runs", "--out", f"{TMP}/loop.json"],  # reused
        "loop.json",
        "loop / bare",
    ),
    "experiments/pacing.py": (
        ["--smoke", "--work", f"{TMP}/work", "--start", TINY, "--out", f"{TMP}/pacing.json"],
        None,
        "pacing",
    ),
    "experiments/soak.py": (
        ["--steps", "4", "--every", "2", "--flat-after", "0", "--kinds", "lora", "--out", f"{TMP}/soak.json"]
        + ["--set=learner.batch_size=4", "--set=collector.num_workers=4", "--set=buffer.max_buffer_size=8"],
        "soak.json",
        "per-step slope",
    ),
    "benchmarks/tictactoe_heuristics.py": (["--games", "50"], None, "win rate vs random"),
    "benchmarks/env_concurrency.py": (
        ["--games", "4", "--sleep-ms", "5", "--seconds", "1", "--out", f"{TMP}/env_concurrency.json"],
        "env_concurrency.json",
        "ratio 4 / 1",
    ),
    "benchmarks/layouts.py": (
        [
            "--model",
            TINY,
            "--repeats",
            "1",
            "--kuhn-decisions",
            "1",
            "--tictactoe-rows",
            "2",
            "--out",
            f"{TMP}/layouts.json",
        ],
        "layouts.json",
        "shared-prompts",
    ),
    "benchmarks/tictactoe_probe.py": ([TINY, "--positions", "8", "--out", f"{TMP}/probe.json"], "probe.json", "center"),
    "experiments/kuhn_card_reading.py": (["probe", TINY, "--steps", "1"], None, "step 1:"),
    "experiments/kuhn_dynamics.py": (["--steps", "20", "--seeds", "1", "--every", "10", "--mmd"], None, "end: mean"),
    "experiments/warm_start.py": (
        ["--games", "4", "--held-out", "4", "--updates", "2", "--eval-every", "1", "--batch-size", "4"]
        + ["--variants", "init 0.1, full fine-tune", "--out-dir", TMP],
        "warm_start.json",
        "legal mass",
    ),
}
NOT_HERE = {
    "benchmarks/footprint.py": "the probes of a run's disk, memory and row size that loop.py and two experiments share",
    "benchmarks/gpu.py": "its CPU smoke path (--smoke) runs in tests/test_gpu_benchmark.py",
    "benchmarks/gym_benchmark.py": "the shared runner of cartpole.py and pendulum.py, not a benchmark",
    "benchmarks/recorded.py": "how the benchmarks record their settings, not a benchmark (tests/test_results.py)",
    "benchmarks/tables.py": "writes the guide's result tables; tests/test_results.py runs its check",
    "benchmarks/learning.py": "test_the_learning_benchmark_and_its_reevaluation below (reevaluate.py reads its output)",
    "benchmarks/reevaluate.py": "test_the_learning_benchmark_and_its_reevaluation below",
    "benchmarks/chaos.py": "each kill is an `unstable train` session and its resume (minutes each); "
    "tests/test_faults.py kills the collector mid-run and resumes, test_resume_kill the whole tree in every phase",
    "experiments/kill_soak.py": "its smallest run is about 15 `unstable train` sessions (2 references, 11 planned "
    "kills, their resumes); tests/test_resume_kill.py kills and resumes a run in every phase in make test",
}


def run_benchmark(script: str, args: list[str], tmp_path: Path, tiny: str) -> str:
    """`python <script> args` (`script` a path in the repository) from the repository root (so default model paths
    resolve as for a user), as a fork of the worker's preloaded process (`tests/zygote.py`); its stdout. Fails with the
    end of its stderr when the script does."""
    argv = [a.replace(TMP, str(tmp_path)).replace(TINY, tiny) for a in args]
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    done = run_python([str(ROOT / script), *argv], cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_benchmark_and_experiment_has_a_smoke_run_or_a_reason():
    scripts = {f"{folder}/{path.name}" for folder in FOLDERS for path in (ROOT / folder).glob("*.py")}
    assert scripts == set(SMOKES) | set(NOT_HERE), "add the new script to SMOKES (or NOT_HERE, with the reason)"


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKES))
def test_the_benchmark_runs_with_its_smallest_settings(script, tiny_model_dir, tmp_path):
    args, written, said = SMOKES[script]
    stdout = run_benchmark(script, args, tmp_path, tiny_model_dir)
    assert said in stdout, stdout[-2000:]
    if written:
        assert (tmp_path / written).stat().st_size > 0


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_the_loop_benchmark_compares_the_routings(tiny_model_dir, tmp_path):
    """`loop.py --routing`: the loop with 2 inference actors once per `inference.routing`."""
    args = ["--routing", "--steps", "2", "--workers", "2", "--batch-size", "4", "--max-new-tokens", "4"]
    args += ["--run-dir", f"{TMP}/runs", "--out", f"{TMP}/routing.json"]
    assert "least_outstanding" in run_benchmark("benchmarks/loop.py", args, tmp_path, tiny_model_dir)
    result = json.loads((tmp_path / "routing.json").read_text())
    assert set(result["runs"]) == {"least_outstanding", "game"} and "prefix_cache_hit_rate" in result["runs"]["game"]


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
def test_the_loop_benchmark_compares_learners_and_inference_actors(tiny_model_dir, tmp_path):
    """`loop.py --scale`: the loop with 2 learners x 2 inference actors (the default's largest of its four runs; the
    others differ only in the two counts), its balance."""
    args = ["--scale", "--scales", "2x2", "--steps", "2", "--workers", "2", "--batch-size", "4"]
    args += ["--max-new-tokens", "4", "--run-dir", f"{TMP}/runs", "--out", f"{TMP}/scaling.json"]
    assert "learner tok/s" in run_benchmark("benchmarks/loop.py", args, tmp_path, tiny_model_dir)
    runs = json.loads((tmp_path / "scaling.json").read_text())["runs"]
    assert [(run["learners"], run["inference_actors"]) for run in runs.values()] == [(2, 2)]
    for run in runs.values():
        assert run["learner_tokens_per_s"] > 0 and 0 <= run["learner_wait_share"] <= 1 and run["recommendation"]


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
def test_the_learning_benchmark_and_its_reevaluation(tiny_model_dir, tmp_path):
    """One recipe (the TicTacToe one: its curve, the minimax column; the Kuhn Poker recipe runs through `unstable
    train` in test_recipes.py) over one seed, then reevaluate.py on what it wrote."""
    model = [f"--set=model.path={tiny_model_dir}", "--set=model.build_tiny_if_missing=false"]
    recipe = str(ROOT / "examples" / "tictactoe-tiny-strong.yaml")
    args = [recipe, "--smoke", *model, "--out", f"{TMP}/learning", "--runs-dir", f"{TMP}/runs"]
    assert "mean change of the win rate vs random" in run_benchmark(
        "benchmarks/learning.py", args, tmp_path, tiny_model_dir
    )
    result = json.loads((tmp_path / "learning" / "learning.json").read_text())
    seed = result["recipes"]["tictactoe-tiny-strong"]["seeds"]["0"]
    assert [point["step"] for point in seed["curve"]] == [0, 2]
    spent = seed["curve"][-1]
    assert spent["seconds"] > 0 and spent["generated_tokens"] > 0  # what RL spent by the step, for learning-cost.png
    assert (tmp_path / "learning" / "learning-cost.png").exists()
    assert Path(seed["checkpoints"]["2"], "config.json").exists()
    args = [f"{TMP}/learning", "--games", "2", "--out", f"{TMP}/reeval.json"]
    assert "separated=" in run_benchmark("benchmarks/reevaluate.py", args, tmp_path, tiny_model_dir)
    assert json.loads((tmp_path / "reeval.json").read_text())["seeds"]


@pytest.mark.slow
def test_the_anchors_regularised_equilibrium_nears_kuhns_equilibrium_as_its_temperature_falls(tmp_path):
    """`kuhn_card_reading.py anchored` (the smoke above runs its `probe`): the figures the log cites for two
    temperatures, and the Queen played apart from the King at both."""
    stdout = run_benchmark("experiments/kuhn_card_reading.py", ["anchored", "--taus", "0.5", "0.1"], tmp_path, "")
    hot, cold = stdout.splitlines()
    assert "exploitability 0.1124" in hot and "exploitability 0.0189" in cold
    for line in (hot, cold):
        strategy = ast.literal_eval(line[line.index("{") :])
        assert strategy["Kb"] - strategy["Qb"] > 0.3  # facing a bet the King calls, the Queen mixes


@pytest.mark.slow
def test_an_anchor_reset_to_each_regularised_equilibrium_walks_toward_kuhns_equilibrium(tmp_path):
    """`anchored --resets`: R-NaD's outer loop, the anchor replaced by the regularised equilibrium it led to; at the
    recipe's temperature each of the first two resets lowers the exploitability the log cites."""
    arguments = ["anchored", "--taus", "0.5", "--resets", "2"]
    stdout = run_benchmark("experiments/kuhn_card_reading.py", arguments, tmp_path, "")
    lines = stdout.splitlines()
    assert len(lines) == 3 and "exploitability 0.1124" in lines[0]
    assert "reset 1" in lines[1] and "exploitability 0.0620" in lines[1]
    assert "reset 2" in lines[2] and "exploitability 0.0404" in lines[2]


@pytest.mark.slow
def test_the_floor_ties_the_information_sets_it_is_given_and_refuses_unknown_ones(tmp_path):
    """`floor --alike`: the least exploitable strategy found plays the tied information sets alike, and above 0
    (Kuhn's equilibrium plays the Jack and the Queen apart after a check); unknown sets or no restarts are a usage
    error."""
    arguments = ["floor", "--alike", "Jc=Qc", "J=Q", "--restarts", "1"]
    value_line, strategy_line = run_benchmark("experiments/kuhn_card_reading.py", arguments, tmp_path, "").splitlines()
    strategy = ast.literal_eval(strategy_line)
    assert strategy["Jc"] == strategy["Qc"] and strategy["J"] == strategy["Q"]
    assert float(value_line.rsplit(" ", 1)[1]) > 0.02
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    script = str(ROOT / "experiments/kuhn_card_reading.py")
    refusals = ((["--alike", "Jx=Qc"], "--alike 'Jx=Qc'"), (["--restarts", "0"], "--restarts must be at least 1"))
    for bad, says in refusals:
        refused = run_python([script, "floor", *bad], cwd=ROOT, env=env, timeout=60)
        assert refused.returncode == 2 and says in refused.stderr
