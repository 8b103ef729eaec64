"""`unstable.rl.gym_utils`: collecting episodes from vector envs, discrete and continuous agents, a short run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from unstable.rl import cli
from unstable.rl.gym_utils import (
    EVAL_MEAN_RETURN,
    GymCollector,
    GymConfig,
    env_actions,
    make_gym_agent,
    make_vector_env,
    train_gym,
)
from unstable.rl.trainer import KL, TorchTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_collector_counts_env_steps_and_cuts_episodes():
    envs = make_vector_env("CartPole-v1", 3)
    agent = make_gym_agent(envs, [16])
    collector = GymCollector(envs, seed=0)
    episodes = collector.collect(agent, 40)
    episodes += collector.collect(agent, 40)
    assert collector.env_steps == 3 * 80
    assert sum(ep.rewards.numel() for ep in episodes) == 3 * 80
    assert any(ep.terminated for ep in episodes) and any(not ep.terminated for ep in episodes)
    for ep in episodes:
        assert ep.observations.shape == (ep.rewards.numel() + 1, 4)
        assert ep.actions.shape == ep.rewards.shape == ep.action_lls.shape
    assert len(collector.completed_returns) == sum(ep.terminated for ep in episodes)


def test_agent_reproduces_the_likelihoods_it_acted_with():
    envs = make_vector_env("Pendulum-v1", 2)
    agent = make_gym_agent(envs, [16])
    episodes = GymCollector(envs, seed=0).collect(agent, 10)
    outputs = agent(episodes)
    for ep, out in zip(episodes, outputs):
        torch.testing.assert_close(out.action_lls, ep.action_lls)
        assert out.state_encodings.shape == (11, agent.state_encoding_size)
        assert out.action_dists.batch_shape == (10,)


def test_continuous_actions_are_scaled_to_the_box():
    env = gym.make("Pendulum-v1")
    assert env_actions(env, torch.tensor([[-5.0], [0.5]])).tolist() == [[-2.0], [1.0]]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_one_train_step_on_each_kind_of_action(env_id, tmp_path):
    envs = make_vector_env(env_id, 2)
    agent = make_gym_agent(envs, [16])
    trainer = TorchTrainer(GymConfig(log_dir=str(tmp_path), vf_hidden_sizes=[16], policy_epochs=2), agent)
    for ep in GymCollector(envs, seed=0).collect(agent, 32):
        trainer.add_episode(ep, ep.rewards, ep.action_lls, ep.terminated)
    vf_before = [p.detach().clone() for p in trainer.vf.parameters()]
    stats = trainer.train_step()
    assert trainer.total_env_steps == 64
    assert stats[KL] > 0
    assert all(not torch.equal(a, b) for a, b in zip(vf_before, trainer.vf.parameters()))


@pytest.mark.slow
def test_train_gym_runs_evaluates_and_resumes(tmp_path):
    cfg = GymConfig(
        log_dir=str(tmp_path), num_envs=2, steps_per_collect=16, total_env_steps=128, eval_interval=2,
        eval_episodes=1, hidden_sizes=[8], vf_hidden_sizes=[8], env_id="CartPole-v1",
    )  # fmt: skip
    stats = train_gym(cfg)
    assert stats[EVAL_MEAN_RETURN] > 0
    assert len(list((cfg.run_dir / "checkpoints").glob("*.pt"))) == 4
    stats_again = train_gym(cfg.replace(total_env_steps=192))
    assert len(list((cfg.run_dir / "checkpoints").glob("*.pt"))) == 6
    assert stats_again[EVAL_MEAN_RETURN] > 0


@pytest.mark.slow
def test_cartpole_example_trains_through_the_launcher(tmp_path, monkeypatch):
    path = Path(__file__).resolve().parents[1] / "examples" / "gym_cartpole.py"
    spec = importlib.util.spec_from_file_location("gym_cartpole", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gym_cartpole", example)  # dataclasses look their module up there
    spec.loader.exec_module(example)
    argv = ["train", f"--log_dir={tmp_path}", "--total_env_steps=64", "--num_envs=2", "--steps_per_collect=16"]
    argv += ["--eval_interval=1", "--eval_episodes=1", "--hidden_sizes=[8]", "--vf_hidden_sizes=[8]"]
    stats = cli.run(example.train, example.CartPoleConfig, argv)
    assert stats[EVAL_MEAN_RETURN] > 0
