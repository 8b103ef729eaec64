"""The `unstable.rl.cli` launcher: `train` with a config file and overrides, `tune` with optuna."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest
import torch

from unstable.rl import cli
from unstable.rl.config import FloatRange, TrainerConfig, knob
from unstable.rl.trainer import TorchTrainer

from .test_rl_trainer import BanditAgent, play

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclasses.dataclass
class BanditConfig(TrainerConfig):
    """A config with one extra field, tuned alongside the trainer's own."""

    train_steps: int = knob(2, "Train steps per run.")
    episodes_per_step: int = knob(16, "Bandit pulls per train step.")
    init_logit: float = knob(0.0, "Initial logit of the paying arm.", FloatRange(-1.0, 1.0))


def train_bandit(cfg: BanditConfig) -> dict[str, float]:
    """Train the 2-armed bandit briefly; the primary stat is the probability of the paying arm."""
    torch.manual_seed(cfg.seed)
    agent = BanditAgent()
    with torch.no_grad():
        agent.logits[1] = cfg.init_logit
    trainer = TorchTrainer(cfg, agent)
    for _ in range(cfg.train_steps):
        play(trainer, agent, cfg.episodes_per_step)
        trainer.train_step()
    return {cfg.primary_stat: agent.p_good()}


def test_train_reads_the_config_file_then_the_overrides(tmp_path):
    BanditConfig(agent_lr=0.5, train_steps=1, vf_hidden_sizes=[4]).to_yaml(tmp_path / "base.yaml")
    seen = []
    argv = ["train", "--config", str(tmp_path / "base.yaml"), "--agent_lr=0.01", "--run-name", "x"]
    argv += [f"--log_dir={tmp_path}", "--vf_hidden_sizes=[8, 8]"]
    cli.run(lambda cfg: seen.append(cfg) or {}, BanditConfig, argv)
    cfg = seen[0]
    assert (cfg.agent_lr, cfg.run_name, cfg.train_steps, cfg.vf_hidden_sizes) == (0.01, "x", 1, [8, 8])
    assert BanditConfig.from_yaml(tmp_path / "x" / cli.CONFIG_FILE) == cfg


def test_unknown_field_on_the_command_line_fails_with_its_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.run(train_bandit, BanditConfig, ["train", "--learning_rate=0.1", f"--log_dir={tmp_path}"])
    assert "unknown config field 'learning_rate'" in capsys.readouterr().err


def test_bad_value_on_the_command_line_names_the_field(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.run(train_bandit, BanditConfig, ["train", "--policy_epochs=lots", f"--log_dir={tmp_path}"])
    assert "policy_epochs='lots'" in capsys.readouterr().err


@pytest.mark.slow
def test_tune_runs_three_trials_of_two_seeds_and_writes_the_best_config(tmp_path):
    argv = ["tune", "--n-trials", "3", "--seeds", "2", "--seed=5", f"--log_dir={tmp_path}", "--run_name=study"]
    argv += ["--vf_hidden_sizes=[4]", "--vf_pre_epochs=1", "--policy_epochs=1"]
    best = cli.run(train_bandit, BanditConfig, argv)
    run_dir = tmp_path / "study"
    with sqlite3.connect(run_dir / cli.STUDY_FILE) as db:
        states = [row[0] for row in db.execute("SELECT state FROM trials")]
        params = {row[0] for row in db.execute("SELECT param_name FROM trial_params")}
    assert states == ["COMPLETE"] * 3
    assert {"init_logit", "agent_lr", "awr_temperature"} <= params
    assert "vf_pre_epochs" not in params and "policy_epochs" not in params  # fixed on the command line
    assert sorted(p.name for p in (run_dir / "trial_0").iterdir()) == ["seed_0", "seed_1"]
    assert BanditConfig.from_yaml(run_dir / cli.BEST_CONFIG_FILE) == best
    assert (best.vf_pre_epochs, best.seed) == (1, 5)


@pytest.mark.slow
def test_tune_scores_are_the_mean_over_seeds(tmp_path):
    import optuna

    cfg = BanditConfig(log_dir=str(tmp_path), run_name="s", train_steps=1, vf_hidden_sizes=[4])
    cli.tune(lambda c: float(c.seed), cfg, n_trials=1, seeds=3)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / cli.STUDY_FILE}")
    trial = study.trials[0]
    assert trial.user_attrs[cli.SEED_SCORE_ATTR] == [0.0, 1.0, 2.0]
    assert trial.value == 1.0
