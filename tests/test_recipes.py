"""The recipes are config files: each validates with the config loader, holds the settings of the measured run the
docs cite (recorded in that run's `learning.json`), and runs through `unstable train` as it is."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from unstable.config import load_config

from .zygote import run_python

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
import learning  # noqa: E402


@pytest.mark.parametrize("path", learning.RECIPES, ids=lambda p: p.name)
def test_every_recipe_the_benchmark_runs_validates_and_names_a_game_it_evaluates(path):
    cfg = load_config(path)
    assert learning.game_of(cfg, path) in learning.OPPONENTS
    assert cfg.warm_start is not None and cfg.learner.policy.lora is None  # the tiny model: full fine-tuning from SFT


def _measured(name: str) -> dict:
    return json.loads((RESULTS / name / "learning.json").read_text())["settings"]


def _warm_and_rl(cfg) -> dict:
    """The settings a learning.json of the benchmark's own-settings days recorded, as the recipe holds them."""
    learner, ws, inference = cfg.learner, cfg.warm_start, cfg.inference
    return {
        "finetune": "full" if learner.policy.lora is None else "lora",
        "sft_games": ws.games,
        "sft_epochs": ws.epochs,
        "sft_batch_size": ws.batch_size,
        "sft_lr": ws.learning_rate,
        "rl_steps": learner.num_steps,
        "rl_batch_size": learner.batch_size,
        "rl_lr": learner.optimizer.learning_rate,
        "rl_lr_schedule": learner.optimizer.lr_schedule,
        "rl_min_lr_ratio": learner.optimizer.min_lr_ratio,
        "rl_workers": cfg.collector.num_workers,
        "temperature": inference.temperature,
        "max_new_tokens": inference.max_new_tokens,
    }


def test_the_demo_recipe_is_the_one_measured_over_five_runs():
    """README and docs/learning.md, "The demo's recipe": the spread of `examples/tictactoe-tiny.yaml` over five fresh
    runs is benchmarks/results/demo-400 (`benchmarks/demo.py`, which records the file it ran, with no override)."""
    measured = json.loads((RESULTS / "demo-400" / "demo.json").read_text())
    assert measured["settings"]["set"] == [] and len(measured["runs"]) == 5
    assert measured["recipe"] == yaml.safe_load((ROOT / "examples" / "tictactoe-tiny.yaml").read_text())


def test_the_benchmark_recipes_are_the_ones_measured_from_a_fresh_clone():
    """docs/learning.md, "The learning benchmark's recipes": measured from a fresh clone of 5192767,
    benchmarks/results/default-5192767."""
    measured = _measured("default-5192767")
    ttt = load_config(ROOT / "examples" / "tictactoe-tiny-strong.yaml")
    assert {k: measured[k] for k in _warm_and_rl(ttt)} == _warm_and_rl(ttt)
    assert ttt.warm_start.agents == [measured["sft_agent"]] * 2
    assert ttt.learner.optimizer.warmup_steps == measured["rl_warmup_steps"] and ttt.learner.algorithm.args == {}
    assert ttt.pool.sample_mode == "fixed" and ttt.pool.fixed_opponents == measured["train_opponent"].split(",")
    assert ttt.buffer.max_buffer_size == 2 * measured["rl_batch_size"]
    assert [t.name for t in ttt.buffer.sampling_reward_transforms] == ["NormalizeRewardsByOpponent"]
    kuhn = load_config(ROOT / "examples" / "kuhn-poker-tiny.yaml")
    assert kuhn.warm_start.agents == [measured["kuhn_sft_agent"]] * 2
    assert kuhn.warm_start.games == measured["kuhn_sft_games"]
    assert (kuhn.learner.num_steps, kuhn.learner.batch_size) == (
        measured["kuhn_rl_steps"],
        measured["kuhn_rl_batch_size"],
    )
    assert (kuhn.learner.optimizer.learning_rate, kuhn.learner.optimizer.warmup_steps) == (measured["kuhn_rl_lr"], 0)
    assert kuhn.pool.sample_mode == measured["kuhn_train_opponent"] == "mirror"
    assert kuhn.buffer.max_buffer_size == 2 * measured["kuhn_rl_batch_size"]
    assert [t.name for t in kuhn.buffer.sampling_reward_transforms] == ["NormalizeRewardsByEnv"]
    assert kuhn.learner.algorithm.args == {"ref_kl_coef": 0.1}  # the benchmark's RECIPE_ARGS of then


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["kuhn-poker-tiny.yaml", "kuhn-poker-tiny-vines.yaml", "kuhn-poker-tiny-mmd.yaml"])
def test_a_recipe_runs_through_unstable_train_as_it_is(recipe, tiny_model_dir, tmp_path):
    """The Kuhn Poker recipes, cut to 2 learner steps after a 4-game warm start, through the `unstable` command."""
    sets = [
        f"run.dir={tmp_path}",
        f"model.path={tiny_model_dir}",
        "warm_start.games=4",
        "learner.num_steps=2",
        "learner.batch_size=4",
        "buffer.max_buffer_size=8",
        "collector.num_workers=2",
        "evaluation.games_at_start=2",
        "evaluation.games_at_end=2",
        "tracker.tensorboard=false",
    ]
    command = ["-m", "unstable.cli.main", "train", f"examples/{recipe}", "--no-wandb"]
    done = run_python(
        [*command, *(arg for s in sets for arg in ("--set", s))], cwd=ROOT, env=dict(os.environ), timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm start epoch 1" in done.stdout and "step    2/2" in done.stdout
    # a run that goes well warns of nothing: neither a warning of ours nor a deprecated Ray API in an actor
    assert "WARNING unstable" not in done.stderr and "DeprecationWarning" not in done.stderr, done.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "checkpoints" / "ckpt-2" / "config.json").exists()  # every weight, from the warm start's model
    assert (run_dir / "warm-start" / "checkpoints").is_dir()


def test_the_vine_recipe_is_the_one_measured_beside_the_stronger_one():
    """docs/learning.md, "Credit per move: vines": benchmarks/results/vines, both recipes run as their files are."""
    settings = _measured("vines")
    assert [Path(p).name for p in settings["recipes"]] == ["tictactoe-tiny-strong.yaml", "tictactoe-tiny-vines.yaml"]
    assert settings["set"] == []
    vines = load_config(ROOT / "examples" / "tictactoe-tiny-vines.yaml")
    strong = load_config(ROOT / "examples" / "tictactoe-tiny-strong.yaml")
    assert (vines.collector.vines.rollouts, vines.collector.vines.decisions) == (3, "all")
    assert [t.name for t in vines.buffer.sampling_reward_transforms] == ["BaselineByGroup", "NormalizeRewardsByEnv"]
    assert vines.learner == strong.learner and vines.warm_start == strong.warm_start  # the vines are the difference


@pytest.mark.parametrize("seed", [60, 61, 62])
def test_the_kuhn_vine_recipe_is_the_one_measured_from_the_random_move_warm_start(seed):
    """docs/learning.md, "Credit per move: vines", Kuhn Poker from the random-move warm start: benchmarks/results/
    vines-kuhn ran kuhn-poker-tiny.yaml with `--set` overrides; examples/kuhn-poker-tiny-vines.yaml holds exactly
    those settings."""
    settings = _measured(f"vines-kuhn/seed-{seed}")
    assert [Path(p).name for p in settings["recipes"]] == ["kuhn-poker-tiny.yaml"]
    measured = load_config(ROOT / "examples" / "kuhn-poker-tiny.yaml", overrides=settings["set"])
    recipe = load_config(ROOT / "examples" / "kuhn-poker-tiny-vines.yaml")
    assert recipe.run.name == "kuhn-poker-tiny-vines"
    assert recipe.model_copy(update={"run": measured.run}) == measured


@pytest.mark.parametrize("seed", [60, 61, 62])
def test_the_kuhn_vine_recipe_is_the_one_measured_from_the_equilibrium_warm_start(seed):
    """docs/learning.md, "Credit per move: vines", Kuhn Poker from the equilibrium warm start: benchmarks/results/
    vines-kuhn/nash-warm-start ran examples/kuhn-poker-tiny-vines.yaml with only the warm start's agents changed."""
    settings = _measured(f"vines-kuhn/nash-warm-start/seed-{seed}")
    assert [Path(p).name for p in settings["recipes"]] == ["kuhn-poker-tiny-vines.yaml"]
    measured = load_config(ROOT / "examples" / "kuhn-poker-tiny-vines.yaml", overrides=settings["set"])
    assert measured.warm_start.agents == ["kuhn-nash", "kuhn-nash"]
    recipe = load_config(ROOT / "examples" / "kuhn-poker-tiny-vines.yaml")
    assert measured.model_copy(update={"warm_start": recipe.warm_start}) == recipe
