"""`TorchTrainer`, `TrainerConfig` and `Agent` on hand-made episodes: learning, counters, checkpoints, resume."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from unstable.rl import normalized_awr_weights
from unstable.rl.agent import Agent, AgentOutput
from unstable.rl.config import TrainerConfig
from unstable.rl.normalize import RunningMeanStd
from unstable.rl.trainer import (
    BEST_CHECKPOINT,
    EXTRA_LOSS,
    KL,
    MINIBATCH_SIZE,
    OOM_COUNT,
    RHO_MEAN,
    TorchTrainer,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class BanditAgent(Agent):
    """Episodes are lists of action ids of a 2-armed bandit; the policy is one logit vector."""

    def __init__(self, fail_above_steps: int | None = None):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(2))
        self.state_encoding_size = 3
        self.fail_above_steps = fail_above_steps

    def forward(self, episodes: list[list[int]]) -> list[AgentOutput]:
        if self.fail_above_steps and sum(len(ep) + 1 for ep in episodes) > self.fail_above_steps:
            raise torch.OutOfMemoryError("simulated")
        outputs = []
        for actions in episodes:
            lls = torch.log_softmax(self.logits, -1)[torch.tensor(actions)]  # (T,)
            encodings = torch.cat([torch.ones(len(actions) + 1, 1), self.logits.expand(len(actions) + 1, 2)], -1)
            outputs.append(AgentOutput(encodings, lls))
        return outputs

    def p_good(self) -> float:
        return torch.softmax(self.logits, -1)[1].item()


def play(trainer: TorchTrainer, agent: BanditAgent, episodes: int, length: int = 1) -> None:
    """Sample `episodes` episodes from the agent; arm 1 pays 1, arm 0 pays 0."""
    with torch.no_grad():
        probs = torch.softmax(agent.logits, -1)
    for _ in range(episodes):
        actions = torch.multinomial(probs, length, replacement=True)  # (T,)
        trainer.add_episode(actions.tolist(), actions.float(), torch.log(probs[actions]), terminated=True)


def config(tmp_path, **changes) -> TrainerConfig:
    base = dict(log_dir=str(tmp_path), run_name="bandit", agent_lr=0.05, replay_buffer_steps=64, vf_hidden_sizes=[8])
    return TrainerConfig(**(base | changes))


@pytest.mark.slow
def test_bandit_learns_to_pull_the_paying_arm(tmp_path):
    torch.manual_seed(0)
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path), agent)
    for _ in range(15):
        play(trainer, agent, 32)
        trainer.train_step()
    assert agent.p_good() > 0.7


def test_env_step_counter_counts_every_added_step(tmp_path):
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path), agent)
    play(trainer, agent, 5, length=3)
    play(trainer, agent, 2, length=4)
    assert trainer.total_env_steps == 5 * 3 + 2 * 4
    assert trainer.total_episodes == 7


def test_replay_buffer_keeps_the_newest_steps(tmp_path):
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path, replay_buffer_steps=10), agent)
    play(trainer, agent, 7, length=3)
    assert trainer.buffer_steps == 9
    assert len(trainer.buffer) == 3


def test_awr_weights_grow_with_the_advantage():
    advantages = torch.tensor([[-2.0, -1.0, 0.0, 1.0, 3.0]])  # (1, 5)
    for stats in (None, RunningMeanStd(momentum=0.1)):
        weights = normalized_awr_weights(advantages, temperature=1.0, clip=8.0, stats=stats)
        assert (weights[0, 1:] > weights[0, :-1]).all()
        assert weights.mean().item() == pytest.approx(1.0)


def test_kl_multiplier_sees_a_positive_kl_after_the_first_minibatch(tmp_path):
    torch.manual_seed(0)
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path, minibatch_max_size=8, policy_epochs=2), agent)
    play(trainer, agent, 32)
    stats = trainer.train_step()
    assert stats[KL] > 0


def test_off_policy_episodes_get_clipped_importance_weights(tmp_path):
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path), agent)
    for action in (0, 1) * 8:  # a behaviour policy that was sure of its action: rho = 0.5 / 1
        trainer.add_episode([action], torch.tensor([float(action)]), torch.zeros(1))
    assert trainer.train_step()[RHO_MEAN] == pytest.approx(0.5, abs=1e-3)


def test_offline_episodes_without_likelihoods_train(tmp_path):
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path), agent)
    for _ in range(5):
        for action in (0, 1, 1):
            trainer.add_episode([action], torch.tensor([float(action)]), action_lls=None)
        stats = trainer.train_step()
    assert stats[RHO_MEAN] == pytest.approx(1.0)
    assert agent.p_good() > 0.5


def test_minibatch_halves_on_out_of_memory_and_grows_back(tmp_path):
    agent = BanditAgent(fail_above_steps=8)
    trainer = TorchTrainer(config(tmp_path, minibatch_max_size=32), agent)
    play(trainer, agent, 16)
    stats = trainer.train_step()
    assert stats[OOM_COUNT] == 2  # 32 -> 16 -> 8 time-steps
    assert stats[MINIBATCH_SIZE] == 8
    agent.fail_above_steps = None
    assert trainer.train_step()[MINIBATCH_SIZE] == 16


def test_agent_output_with_wrong_shapes_fails_clearly(tmp_path):
    class Broken(BanditAgent):
        def forward(self, episodes):
            return [AgentOutput(torch.zeros(len(ep), 3), torch.zeros(len(ep))) for ep in episodes]

    trainer = TorchTrainer(config(tmp_path), Broken())
    trainer.add_episode([0, 1], torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="state_encodings must be"):
        trainer.train_step()


def test_extra_loss_is_added_with_its_coefficient(tmp_path):
    class WithExtraLoss(BanditAgent):
        def forward(self, episodes):
            outputs = super().forward(episodes)
            for out in outputs:
                out.extra_loss = self.logits.square().sum() + 1.0
            return outputs

    agent = WithExtraLoss()
    trainer = TorchTrainer(config(tmp_path, extra_loss_coef=0.5, policy_epochs=1), agent)
    play(trainer, agent, 4)
    assert trainer.train_step()[EXTRA_LOSS] == pytest.approx(0.5, abs=1e-3)


def test_train_step_needs_episodes(tmp_path):
    with pytest.raises(RuntimeError, match="add_episode"):
        TorchTrainer(config(tmp_path), BanditAgent()).train_step()


def _assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), where


def test_resume_restores_the_same_state_dict(tmp_path):
    torch.manual_seed(0)
    cfg = config(tmp_path, checkpoint_interval=2)
    agent = BanditAgent()
    trainer = TorchTrainer(cfg, agent)
    for _ in range(4):
        play(trainer, agent, 8)
        trainer.train_step()
        trainer.add_eval_stats({cfg.primary_stat: agent.p_good()})
        trainer.maybe_checkpoint()
    resumed = TorchTrainer(cfg, BanditAgent())
    assert resumed.attempt_resume()
    _assert_same(trainer.state_dict(), resumed.state_dict())
    assert resumed.total_env_steps == 32
    assert resumed.train_steps == 4


def test_attempt_resume_without_checkpoint_starts_fresh(tmp_path):
    assert not TorchTrainer(config(tmp_path), BanditAgent()).attempt_resume()


def test_checkpoint_best_keeps_the_best_primary_stat(tmp_path):
    cfg = config(tmp_path, checkpoint_interval=0)
    agent = BanditAgent()
    trainer = TorchTrainer(cfg, agent)
    best_logits = None
    for score in (1.0, 3.0, 2.0, 0.5):
        with torch.no_grad():
            agent.logits.fill_(score)
        trainer.add_eval_stats({cfg.primary_stat: score})
        written = trainer.maybe_checkpoint()
        if score == 3.0:
            best_logits = agent.logits.detach().clone()
            assert written == [cfg.run_dir / BEST_CHECKPOINT]
        elif score < 3.0 and best_logits is not None:
            assert written == []
    saved = torch.load(cfg.run_dir / BEST_CHECKPOINT, weights_only=False)
    assert saved["best_primary_stat"] == 3.0
    assert torch.equal(saved["agent"]["logits"], best_logits)


def test_checkpoint_best_can_minimise(tmp_path):
    cfg = config(tmp_path, checkpoint_interval=0, primary_stat="loss", primary_stat_higher_is_better=False)
    trainer = TorchTrainer(cfg, BanditAgent())
    for value in (2.0, 1.0, 5.0):
        trainer.add_eval_stats({"loss": value})
        trainer.maybe_checkpoint()
    assert torch.load(cfg.run_dir / BEST_CHECKPOINT, weights_only=False)["best_primary_stat"] == 1.0


def test_accelerate_single_process(tmp_path):
    torch.manual_seed(0)
    agent = BanditAgent()
    trainer = TorchTrainer(config(tmp_path, use_accelerate="always"), agent)
    assert trainer.cluster.accelerator is not None
    assert trainer.cluster.num_processes == 1
    play(trainer, agent, 16)
    assert math.isfinite(trainer.train_step()[KL])


@pytest.mark.slow
def test_two_processes_keep_identical_weights(tmp_path):
    """Two torchrun processes with different amounts of data: gradients are averaged and no collective waits
    forever, so both end with the same weights."""
    worker = Path(__file__).with_name("rl_two_process_worker.py")
    torchrun = Path(sys.executable).with_name("torchrun")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker), str(tmp_path)]
    done = subprocess.run(command, env=env, timeout=240, capture_output=True, text=True)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert rank0["num_processes"] == rank1["num_processes"] == 2
    _assert_same(rank0, rank1)


# ---- TrainerConfig --------------------------------------------------------------------------------------


def test_config_yaml_round_trip(tmp_path):
    cfg = TrainerConfig(agent_lr=1e-3, vf_hidden_sizes=[4, 4], run_name="x", checkpoint_best=False)
    cfg.to_yaml(tmp_path / "c.yaml")
    assert TrainerConfig.from_yaml(tmp_path / "c.yaml") == cfg


def test_unknown_config_field_fails_with_its_name():
    with pytest.raises(ValueError, match="unknown config field 'learning_rate'"):
        TrainerConfig.from_dict({"learning_rate": 0.1})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("discount", -1.0, "discount=-1.0 must be positive"),
        ("policy_epochs", "four", "policy_epochs='four' must be of type int"),
        ("use_accelerate", "maybe", "use_accelerate='maybe' is not one of"),
        ("vtrace_lambda", 1.5, "vtrace_lambda=1.5 must be in"),
    ],
)
def test_bad_config_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**{field: value})


def test_every_config_field_is_documented():
    import dataclasses

    for f in dataclasses.fields(TrainerConfig):
        assert f.metadata.get("doc"), f.name


class _OpensAFile:
    """A pickle payload: unpickling it calls `open(path, "w")`, as a malicious checkpoint could run anything."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_a_checkpoint_with_a_pickle_payload_is_refused_unrun(tmp_path):
    cfg = config(tmp_path)
    marker = tmp_path / "payload-ran"
    checkpoint = cfg.run_dir / "checkpoints" / "step_00000001.pt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"agent": _OpensAFile(marker)}, checkpoint)
    with pytest.raises(ValueError, match="step_00000001.pt"):
        TorchTrainer(cfg, BanditAgent()).attempt_resume()
    assert not marker.exists()
