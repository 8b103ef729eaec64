"""The learner on the path real users take: the KL reference of a LoRA warm start is the starting adapter (also
after a resume), and bf16 full fine-tuning keeps float32 master weights, so a 1e-5 step changes the weights (through
`unstable train`: test_run_dir_moves.py and test_paced_run.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from unstable.algorithms import Reinforce
from unstable.algorithms.batching import collate
from unstable.learner import Learner, LearnerConfig, LoraConfig, PolicyConfig, PolicyModel
from unstable.tracking import keys

from . import test_algorithms
from .test_algorithms import _bandit_batch, _step

bandit = test_algorithms.bandit  # the two-action text bandit's token ids (a fixture)
LORA = LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"])


# --- the KL reference of a LoRA warm start --------------------------------------------------------------------


@pytest.fixture(scope="module")
def initial_adapter(tiny_model_dir, tmp_path_factory) -> str:
    """A LoRA adapter far from the base model (random weights in both factors), as an SFT warm start leaves one."""
    policy = PolicyModel(tiny_model_dir, PolicyConfig(lora=LORA))
    torch.manual_seed(0)
    policy.load()
    with torch.no_grad():
        for weight in policy.trainable_parameters():
            weight.copy_(torch.randn_like(weight) * 0.05)
    return policy.save(tmp_path_factory.mktemp("adapter") / "initial")


def _warm_learner(tiny_model_dir, adapter: str) -> Learner:
    cfg = LearnerConfig(
        policy={"lora": LORA, "initial_lora_path": adapter}, optimizer={"learning_rate": 0.01}, num_threads=1
    )
    learner = Learner.build(tiny_model_dir, Reinforce(ref_kl_coef=0.1), cfg)
    learner.initialize()
    return learner


def _logprobs(learner: Learner, bandit) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's, the reference's and the base model's log-probs of the bandit's good move, `(1, L-1)` each."""
    batch = collate([_step(prompt=bandit["prompt"], completion=bandit["good"])], learner.policy.pad_id)
    with torch.no_grad():
        with learner.policy.model.disable_adapter():
            base = learner.forward(batch).logprobs
        return learner.forward(batch).logprobs, learner.reference_logprobs(batch), base


def test_the_reference_of_a_lora_warm_start_is_its_initial_adapter(tiny_model_dir, bandit, initial_adapter):
    learner = _warm_learner(tiny_model_dir, initial_adapter)
    policy, reference, base = _logprobs(learner, bandit)
    assert (policy - base).abs().max() > 0.1  # the adapter is far from the base model
    torch.testing.assert_close(reference, policy, rtol=0, atol=1e-6)
    metrics = learner.train_step(_bandit_batch(learner, bandit))  # steps sampled from the initial adapter
    assert metrics[keys.REF_KL] < 1e-6


def test_a_restored_learner_keeps_the_initial_adapter_as_its_reference(tiny_model_dir, bandit, initial_adapter):
    learner = _warm_learner(tiny_model_dir, initial_adapter)
    start, _, _ = _logprobs(learner, bandit)
    for _ in range(2):
        learner.train_step(_bandit_batch(learner, bandit))
    moved, reference, _ = _logprobs(learner, bandit)
    torch.testing.assert_close(reference, start, rtol=0, atol=1e-6)  # training leaves the reference alone
    assert (moved - start).abs().max() > 1e-3

    restored = _warm_learner(tiny_model_dir, initial_adapter)
    restored.load_state_dict(learner.state_dict())
    policy, reference, _ = _logprobs(restored, bandit)
    torch.testing.assert_close(policy, moved, rtol=0, atol=1e-6)  # the resumed weights ...
    torch.testing.assert_close(reference, start, rtol=0, atol=1e-6)  # ... and the starting policy as reference


# --- bf16: float32 master weights, bf16 compute, bf16 checkpoints ----------------------------------------------


def _bf16_learner(tiny_model_dir, lora: LoraConfig | None) -> Learner:
    cfg = LearnerConfig(policy={"lora": lora}, optimizer={"learning_rate": 1e-5}, num_threads=1)
    learner = Learner.build(tiny_model_dir, Reinforce(), cfg, dtype="bfloat16")
    torch.manual_seed(0)
    learner.initialize()
    return learner


def test_bf16_full_finetuning_keeps_float32_masters_so_a_1e_5_step_moves_every_weight(tiny_model_dir, bandit, tmp_path):
    learner = _bf16_learner(tiny_model_dir, None)
    before = learner.policy.trainable_state()
    learner.train_step(_bandit_batch(learner, bandit))
    after = learner.policy.trainable_state()
    changed = sum(int((after[k] != before[k]).sum()) for k in before)
    assert changed > 0.99 * sum(v.numel() for v in before.values())
    assert {v.dtype for v in after.values()} == {torch.float32}
    moments = [t for s in learner.optimizer.state.values() for t in s.values() if t.dim()]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    computed = []
    batch = collate(_bandit_batch(learner, bandit, copies=1), learner.policy.pad_id)
    layer = learner.policy.model.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda module, inputs, output: computed.append(output.dtype))
    learner.forward(batch)
    hook.remove()
    assert computed and set(computed) == {torch.bfloat16}  # the forward computes in the model dtype (each pass)

    saved = load_file(f"{learner.save_checkpoint(str(tmp_path / 'ckpt'))}/model.safetensors")
    assert {v.dtype for v in saved.values()} == {torch.bfloat16}  # what the engines load, at half the size
    assert "lm_head.weight" not in saved  # the tied output layer is the embedding, saved once


def test_bf16_lora_keeps_the_frozen_base_in_bf16_and_the_adapter_in_float32(tiny_model_dir):
    model = _bf16_learner(tiny_model_dir, LORA).policy.model
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
