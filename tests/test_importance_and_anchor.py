"""Stale samples and the KL anchor: truncated importance weights on hand-computed numbers and through a learner
update, and a reference policy that moves to the current one every `ref_reset_every` updates, or a fraction
`ref_mix` of the way there (also after a resume)."""

from __future__ import annotations

import math

import pytest
import torch

from unstable.algorithms import A2C, ALGORITHMS, GroupBaseline, Reinforce
from unstable.algorithms.base import importance_weights
from unstable.algorithms.batching import collate
from unstable.config import ConfigError, load_config
from unstable.learner import LoraConfig
from unstable.tracking import keys

from . import test_algorithms
from .runs import EXAMPLE
from .test_algorithms import _bandit_batch, _learner, _scored, _step

bandit = test_algorithms.bandit  # the two-action text bandit's token ids (a fixture)
E = math.e


def _stale_batch():
    """Row 0: completion log-probs (0, -3) now, (-1, -2) when sampled: ratios e and 1/e; reward +1.
    Row 1: -4 now, -0.5 when sampled: ratio e^-3.5; reward -1."""
    steps = [
        _step(behaviour=(-1.0, -2.0), reward=1.0),
        _step(prompt=(1,), completion=(5,), behaviour=(-0.5,), reward=-1.0),
    ]
    batch = collate(steps, pad_id=0)
    logp = torch.tensor([[-9.0, 0.0, -3.0], [-4.0, -9.0, -9.0]], requires_grad=True)  # -9: not completion
    return batch, logp


def test_token_weights_are_the_ratios_truncated_at_the_cap():
    batch, logp = _stale_batch()
    weights, capped = importance_weights(logp, batch, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 2.0, 1 / E], [E**-3.5, 0.0, 0.0]]))
    assert capped == 1  # row 0's first token: e > 2
    assert not weights.requires_grad
    assert importance_weights(logp, batch, cap=None) == (None, 0.0)


def test_sequence_weights_take_one_ratio_per_completion():
    batch, logp = _stale_batch()
    weights, capped = importance_weights(logp, batch, cap=2.0, level="sequence")
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 1.0], [E**-3.5, 0.0, 0.0]]))  # e * 1/e = 1
    assert capped == 0


def test_the_weighted_loss_scales_each_tokens_gradient_by_its_weight():
    batch, logp = _stale_batch()
    algorithm = Reinforce(importance_cap=2.0)
    weights, _ = importance_weights(logp, batch, 2.0)
    loss = algorithm.loss(logp, batch, 2, weights)
    row0 = (2.0 * 0.0 + (1 / E) * -3.0) / 2  # own completion length D = 2
    row1 = E**-3.5 * -4.0 / 1
    assert loss.item() == pytest.approx(-(1.0 * row0 + -1.0 * row1) / 2)
    loss.backward()
    expected = torch.tensor([[0.0, -(2.0 / 2) / 2, -(1 / E / 2) / 2], [(E**-3.5) / 2, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    unweighted = Reinforce().loss(logp, batch, 2)  # the correction off: the plain REINFORCE loss
    assert unweighted.item() == pytest.approx(-(1.0 * (0.0 - 3.0) / 2 + -1.0 * -4.0) / 2)


@pytest.mark.parametrize("algorithm", [Reinforce, GroupBaseline, A2C])
def test_an_update_reports_the_capped_share_only_with_the_correction_on(tiny_model_dir, bandit, algorithm):
    learner = _learner(tiny_model_dir, algorithm(importance_cap=1.5))
    # behaviour log-probs 1 below the current ones on the good move's tokens (ratio e, capped), equal on the bad's
    good = _scored(learner, bandit["prompt"], bandit["good"], 1.0, shift=1.0, group_id="g")
    bad = _scored(learner, bandit["prompt"], bandit["bad"], -1.0, group_id="g")
    metrics = learner.train_step([good, bad] * 2)
    n_good, n_bad = len(bandit["good"]), len(bandit["bad"])
    assert metrics[keys.IMPORTANCE_CAPPED_FRACTION] == pytest.approx(n_good / (n_good + n_bad))
    assert math.isfinite(metrics[keys.LOSS])
    off = _learner(tiny_model_dir, algorithm())
    assert keys.IMPORTANCE_CAPPED_FRACTION not in off.train_step([good, bad] * 2)


def test_on_policy_samples_train_as_without_the_correction(tiny_model_dir, bandit):
    """Ratios of 1 are below any cap: with and without the correction the same weights come out."""
    corrected = _learner(tiny_model_dir, Reinforce(importance_cap=2.0))
    plain = _learner(tiny_model_dir, Reinforce())
    batch = _bandit_batch(plain, bandit)
    assert corrected.train_step(batch)[keys.IMPORTANCE_CAPPED_FRACTION] == 0.0
    plain.train_step(batch)
    for (name, a), (_, b) in zip(corrected.policy.trainable_state().items(), plain.policy.trainable_state().items()):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ("{importance_cap: 0.5}", "importance_cap must be >= 1"),
        ("{importance_level: word}", "importance_level must be one of"),
        ("{ref_kl_coef: 0.1, ref_reset_every: 0}", "ref_reset_every must be >= 1"),
        ("{ref_reset_every: 5}", "only a ref_kl_coef above 0 uses"),
        ("{ref_kl_coef: [[0, 0.5], [0, 0.1]]}", "updates must be whole numbers >= 0, increasing"),
        ("{ref_kl_coef: [[0, 0.5], [100, -0.1]]}", "ref_kl_coef must be a finite number >= 0"),
        ("{ref_kl_coef: .inf}", "ref_kl_coef must be a finite number >= 0"),
        ("{ref_kl_coef: [[0, 0.5, 1]]}", "each ref_kl_coef point must be"),
        ("{ref_kl_coef: []}", "a number or a list of"),
        ("{ref_kl_coef: [[0, 0], [10, 0]], ref_reset_every: 5}", "only a ref_kl_coef above 0 uses"),
        ("{ref_mix: 0.01}", "ref_mix moves the KL reference, which only a ref_kl_coef above 0 uses"),
        ("{ref_kl_coef: 0.1, ref_mix: 1.5}", "ref_mix must be a finite number from 0 to 1"),
        ("{ref_kl_coef: 0.1, ref_mix: [[0, 0], [0, 0.1]]}", "ref_mix's updates must be whole numbers"),
    ],
)
def test_a_bad_correction_or_anchor_setting_is_refused_in_one_line(args, fragment):
    with pytest.raises(ConfigError, match=fragment) as refused:
        load_config(EXAMPLE, [f"learner.algorithm.args={args}"])
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("anchor", ["ref_reset_every: 10", "ref_mix: 0.01"])
def test_a_moving_anchor_is_refused_with_a_sharded_model(anchor):
    """The reference copy of an FSDP-sharded model is not sharded, so neither reset nor mix can move it."""
    sharded = ["learner.sharding=fsdp", "learner.policy.lora=null", "learner.num_learners=2"]
    args = f"learner.algorithm.args={{ref_kl_coef: 0.1, {anchor}}}"
    with pytest.raises(ConfigError, match="cannot move the reference of a sharded model") as refused:
        load_config(EXAMPLE, [*sharded, args])
    assert "\n" not in str(refused.value)


# --- the moving anchor -------------------------------------------------------------------------------------------


def _good_logprobs(learner, bandit) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's and the reference's log-probs of the bandit's good move, `(1, L-1)` each."""
    batch = collate([_step(prompt=bandit["prompt"], completion=bandit["good"])], learner.policy.pad_id)
    with torch.no_grad():
        return learner.forward(batch).logprobs, learner.reference_logprobs(batch)


@pytest.mark.parametrize("lora", [LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"]), None])
@pytest.mark.parametrize("name", ["reinforce", "group_baseline"])
def test_the_reference_moves_to_the_policy_every_m_updates_and_after_a_resume(tiny_model_dir, bandit, lora, name):
    def build():
        return _learner(tiny_model_dir, ALGORITHMS[name](ref_kl_coef=0.1, ref_reset_every=2), lora=lora)

    learner = build()
    start, _ = _good_logprobs(learner, bandit)
    learner.train_step(_bandit_batch(learner, bandit))
    moved, reference = _good_logprobs(learner, bandit)
    assert (moved - start).abs().max() > 1e-4
    torch.testing.assert_close(reference, start)  # one update: still the starting policy
    learner.train_step(_bandit_batch(learner, bandit))
    second, reference = _good_logprobs(learner, bandit)
    torch.testing.assert_close(reference, second)  # two updates: the anchor moved to the current policy
    learner.train_step(_bandit_batch(learner, bandit))
    third, reference = _good_logprobs(learner, bandit)
    torch.testing.assert_close(reference, second)  # the policy moves off it again
    assert (third - second).abs().max() > 1e-4

    restored = build()
    restored.load_state_dict(learner.state_dict())
    policy, reference = _good_logprobs(restored, bandit)
    torch.testing.assert_close(reference, second)  # the moved anchor came back with the state
    restored.train_step(_bandit_batch(restored, bandit))  # the resumed run's 4th update moves it again
    fourth, reference = _good_logprobs(restored, bandit)
    torch.testing.assert_close(reference, fourth)


@pytest.mark.parametrize("lora", [LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"]), None])
def test_a_mixed_reference_moves_its_fraction_of_the_way_from_its_scheduled_start_and_after_a_resume(
    tiny_model_dir, bandit, lora
):
    """`ref_mix: [[1, 0], [2, 0.5]]`: the reference stays the starting policy through update 1 (fraction 0), then
    moves halfway to the policy's weights after updates 2 and 3, weight by weight; a LoRA reference that was the
    base model starts as the current adapter with its B zero. A restored learner keeps the mixed weights."""

    def build():
        return _learner(tiny_model_dir, Reinforce(ref_kl_coef=0.1, ref_mix=[[1, 0.0], [2, 0.5]]), lora=lora)

    learner = build()
    start = learner.policy.trainable_state()
    learner.train_step(_bandit_batch(learner, bandit))
    assert learner.state_dict()["reference"] is None  # fraction 0: not moved
    expected = start if lora is None else {n: w * 0 if "lora_B." in n else w for n, w in start.items()}
    for update in (2, 3):
        learner.train_step(_bandit_batch(learner, bandit))
        policy = learner.policy.trainable_state()
        if lora is not None and update == 2:  # its first move: A taken from the policy, B zero
            expected = {n: w if "lora_B." in n else policy[n] for n, w in expected.items()}
        expected = {n: (w + policy[n]) / 2 for n, w in expected.items()}
        reference = learner.state_dict()["reference"]
        assert set(reference) == set(policy)
        for name, weight in reference.items():
            torch.testing.assert_close(weight, expected[name], msg=name)
    restored = build()
    restored.load_state_dict(learner.state_dict())
    for name, weight in restored.state_dict()["reference"].items():
        torch.testing.assert_close(weight, expected[name], msg=name)


def test_a_scheduled_kl_coefficient_moves_linearly_between_its_points_and_resumes_where_it_was(tiny_model_dir, bandit):
    """`ref_kl_coef: [[1, 0.4], [3, 0.0]]`: 0.4 for the first two updates (flat before the first point), halfway at
    update 2, 0 from update 3 on (flat after the last), each step's coefficient logged and its loss term scaled by
    it; a learner restored from the state goes on from the updates taken."""

    def build():
        return _learner(tiny_model_dir, Reinforce(ref_kl_coef=[[1, 0.4], [3, 0.0]]))

    learner = build()
    logged = []
    for _ in range(2):
        metrics = learner.train_step(_bandit_batch(learner, bandit))
        logged.append(metrics[keys.REF_KL_COEF])
        assert metrics[keys.REF_KL_LOSS] == pytest.approx(metrics[keys.REF_KL_COEF] * metrics[keys.REF_KL])
    restored = build()
    restored.load_state_dict(learner.state_dict())
    for _ in range(2):
        logged.append(restored.train_step(_bandit_batch(restored, bandit))[keys.REF_KL_COEF])
    assert logged == pytest.approx([0.4, 0.4, 0.2, 0.0])


def test_without_a_reset_the_state_keeps_no_reference_weights(tiny_model_dir, bandit):
    learner = _learner(tiny_model_dir, Reinforce(ref_kl_coef=0.1))
    learner.train_step(_bandit_batch(learner, bandit))
    state = learner.state_dict()
    assert state["reference"] is None and state["algorithm"] == {"updates": 1}
