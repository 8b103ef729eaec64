"""Train CartPole-v1 with `unstable.rl`: a config subclass, a training function and the launcher.

    PYTHONPATH=src python examples/gym_cartpole.py train --total_env_steps=100000
    PYTHONPATH=src python examples/gym_cartpole.py tune --n-trials 10 --seeds 2 --total_env_steps=50000
    accelerate launch examples/gym_cartpole.py train      # several processes, gradients averaged

The loop below is what `unstable.rl.gym_utils.train_gym` does; it is written out to show the API.
"""

from __future__ import annotations

from dataclasses import dataclass

from unstable.rl import cli
from unstable.rl.config import knob
from unstable.rl.gym_utils import GymCollector, GymConfig, evaluate, make_gym_agent, make_vector_env
from unstable.rl.trainer import KL, TorchTrainer


@dataclass
class CartPoleConfig(GymConfig):
    """`GymConfig` with on-policy CartPole defaults (each train step uses the last 8 x 128 env steps)."""

    replay_buffer_steps: int = knob(1024, "Time-steps kept for training: one collection, so on-policy.")
    agent_lr: float = knob(1e-3, "Adam learning rate of the agent.")
    stop_at_return: float | None = knob(475.0, "Stop once an evaluation's mean return reaches this.")
    eval_episodes: int = knob(20, "Episodes per evaluation.")


def train(cfg: CartPoleConfig) -> dict[str, float]:
    """Collect, add episodes, train, evaluate and checkpoint until the step budget or the target return."""
    envs = make_vector_env(cfg.env_id, cfg.num_envs)
    agent = make_gym_agent(envs, cfg.hidden_sizes)
    trainer = TorchTrainer(cfg, agent)
    trainer.attempt_resume()
    collector = GymCollector(envs, seed=cfg.seed + 1000 * trainer.train_steps)
    while trainer.total_env_steps < cfg.total_env_steps:
        for episode in collector.collect(agent, cfg.steps_per_collect):
            trainer.add_episode(episode, episode.rewards, episode.action_lls, episode.terminated)
        stats = trainer.train_step()
        if trainer.train_steps % cfg.eval_interval == 0:
            trainer.add_eval_stats(evaluate(cfg.env_id, agent, cfg.eval_episodes, seed=10_000))
            print(trainer.total_env_steps, trainer.last_eval_stats, f"kl={stats[KL]:.4f}")
        trainer.maybe_checkpoint()
        if trainer.last_eval_stats.get(cfg.primary_stat, float("-inf")) >= cfg.stop_at_return:
            break
    return trainer.last_eval_stats


if __name__ == "__main__":
    cli.run(train, CartPoleConfig)
