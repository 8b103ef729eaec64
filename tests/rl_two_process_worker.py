"""One process of `test_rl_trainer.py::test_two_processes_keep_identical_weights`, started by torchrun.

Each rank trains the bandit on a different number of episodes, then saves its weights to `<out>/rank<r>.pt`.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_rl_trainer import BanditAgent, play  # noqa: E402
from unstable.rl import TorchTrainer, TrainerConfig  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    agent = BanditAgent()
    cfg = TrainerConfig(log_dir=str(out), agent_lr=0.05, vf_hidden_sizes=[8], minibatch_max_size=8, vf_minibatch_size=8)
    trainer = TorchTrainer(cfg, agent)
    rank = trainer.cluster.process_index
    torch.manual_seed(1 + rank)
    for _ in range(2):
        play(trainer, agent, 8 + 8 * rank)  # rank 1 has twice the data, so twice the minibatches
        trainer.train_step()
    state = {"num_processes": trainer.cluster.num_processes, "agent": agent.state_dict(), "vf": trainer.vf.state_dict()}
    torch.save(state, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
