"""Pendulum-v1 (continuous actions) with `TorchTrainer`: the mean return over 10 deterministic evaluation
episodes before training and after 200 train steps of 1024 env steps each (a random policy scores about -1200;
0 is the best possible).
Run on demand (never from tests):

    PYTHONPATH=src .venv/bin/python benchmarks/pendulum.py --seeds 3
    PYTHONPATH=src .venv/bin/python benchmarks/pendulum.py --smoke --out /tmp/pendulum.json   # 2 train steps (tests)

Writes benchmarks/results/pendulum.json and prints a table.
"""

from __future__ import annotations

from gym_benchmark import make_parser, run_benchmark, smoke_config

from unstable.rl.gym_utils import GymConfig

CONFIG = GymConfig(
    env_id="Pendulum-v1",
    num_envs=8,
    steps_per_collect=128,
    replay_buffer_steps=8 * 128,  # on-policy: each train step sees the last collection only
    discount=0.9,  # Pendulum's reward is immediate; a short horizon is the usual choice for it
    reward_scale=0.1,
    agent_lr=1e-3,
    policy_epochs=10,
    total_env_steps=200 * 1024,  # 200 train steps; the last evaluation lands on the last one
    eval_interval=10,
    eval_episodes=10,
    checkpoint_interval=0,
    checkpoint_best=False,
)


def main() -> None:
    args = make_parser(__doc__.splitlines()[0], default_seeds=3).parse_args()
    cfg, seeds = (smoke_config(CONFIG), 1) if args.smoke else (CONFIG, args.seeds)
    run_benchmark("pendulum", cfg, seeds, args.out, {})


if __name__ == "__main__":
    main()
