"""CartPole-v1 with `TorchTrainer`: env steps and CPU wall time until the mean return over 20 deterministic
evaluation episodes reaches 475 (evaluated every 5 train steps of 1024 env steps; evaluation time counts in the
wall time, evaluation steps do not count as env steps). Run on demand (never from tests):

    PYTHONPATH=src .venv/bin/python benchmarks/cartpole.py --seeds 3
    PYTHONPATH=src .venv/bin/python benchmarks/cartpole.py --seeds 3 --replay-collections 4   # off-policy
    PYTHONPATH=src .venv/bin/python benchmarks/cartpole.py --smoke --out /tmp/cartpole.json   # 2 train steps (tests)

Writes benchmarks/results/cartpole.json (cartpole-replay4.json) and prints a table.
"""

from __future__ import annotations

from gym_benchmark import make_parser, run_benchmark, smoke_config

from unstable.rl.gym_utils import GymConfig

TARGET = 475.0
CONFIG = GymConfig(
    env_id="CartPole-v1",
    num_envs=8,
    steps_per_collect=128,
    replay_buffer_steps=8 * 128,  # on-policy: each train step sees the last collection only
    agent_lr=1e-3,
    total_env_steps=300_000,
    eval_interval=5,
    eval_episodes=20,
    stop_at_return=TARGET,
    checkpoint_interval=0,
    checkpoint_best=False,
)


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0], default_seeds=3)
    parser.add_argument(
        "--replay-collections", type=int, default=1, help="collections kept in the replay buffer (>1: off-policy)"
    )
    args = parser.parse_args()
    cfg = CONFIG.replace(replay_buffer_steps=args.replay_collections * CONFIG.replay_buffer_steps)
    if args.smoke:
        cfg, args.seeds = smoke_config(cfg), 1
    name = "cartpole" if args.replay_collections == 1 else f"cartpole-replay{args.replay_collections}"
    summary = {"target_return": TARGET, "replay_collections": args.replay_collections}
    result = run_benchmark(name, cfg, args.seeds, args.out, summary)
    solved = [run for run in result["runs"] if run["curve"][-1][1] >= TARGET]
    print(f"{len(solved)}/{len(result['runs'])} seeds reached {TARGET}")


if __name__ == "__main__":
    main()
