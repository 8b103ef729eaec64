"""Algorithms: every loss on hand-computed numbers, batching and staleness, and a two-action text bandit on the
tiny model that each algorithm must learn."""

import copy
import dataclasses
import inspect
import math

import pytest
import torch

from unstable.algorithms import A2C, ALGORITHMS, PPO, MagneticMirrorDescent, Reinforce, VTraceAWR
from unstable.algorithms.base import normalized_sum
from unstable.algorithms.batching import collate, decision_positions, micro_batches, pack_micro_batches, share_prompts
from unstable.algorithms.group_baseline import group_advantages
from unstable.algorithms.trainable import PolicyOutput
from unstable.algorithms.vtrace_awr import one_step_vtrace
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.config import ConfigError, validate_config
from unstable.learner import Learner, LearnerConfig, LoraConfig, PolicyConfig, PolicyModel
from unstable.learner.config import nest_flat_fields
from unstable.pool import ModelPool
from unstable.records import GameRecord, Step
from unstable.rl import TrainerConfig, awr_weights
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, keys

E = math.e


def _step(prompt=(1, 2), completion=(3, 4), behaviour=None, reward=0.0, **kw):
    behaviour = behaviour if behaviour is not None else (-1.0,) * len(completion)
    defaults = {"env_id": "E", "player_id": 0, "turn": 0, "observation": "o", "action": "a"}
    return Step(
        **(defaults | kw),
        prompt_token_ids=tuple(prompt),
        completion_token_ids=tuple(completion),
        behaviour_logprobs=tuple(behaviour),
        reward=reward,
    )


def _hand_batch():
    """Row 0: prompt (1, 2), completion (3, 4), reward +1; row 1: prompt (1,), completion (5,), reward -1.

    Targets are aligned as (B, L-1) = (2, 3): row 0's completion sits at target indices 1, 2; row 1's at 0.
    """
    steps = [
        _step(behaviour=(-1.0, -2.0), reward=1.0),
        _step(prompt=(1,), completion=(5,), behaviour=(-0.5,), reward=-1.0),
    ]
    batch = collate(steps, pad_id=0)
    logp = torch.tensor([[-9.0, -1.0, -3.0], [-4.0, -9.0, -9.0]], requires_grad=True)  # -9: not completion
    return batch, logp


# --- batching: truncation, micro-batches, decision positions ------------------------------------------------


def test_collate_aligns_masks_and_truncates_keeping_the_first_tokens():
    batch, _ = _hand_batch()
    assert batch.completion_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch.behaviour_logprobs.tolist() == [[0, -1.0, -2.0], [-0.5, 0, 0]]
    assert decision_positions(batch).tolist() == [1, 0]  # the last prompt token of each row

    cut = collate([_step(prompt=(1, 2, 3, 4), completion=(5, 6, 7, 8), behaviour=(-1, -2, -3, -4))], 0, 6)
    assert cut.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert cut.completion_mask.tolist() == [[0, 0, 0, 1, 1]]
    assert cut.behaviour_logprobs.tolist() == [[0, 0, 0, -1, -2]]
    prompt_only = collate([_step(prompt=(1, 2, 3, 4, 5), completion=(6,))], 0, 3)
    assert prompt_only.completion_mask.sum() == 0 and decision_positions(prompt_only).tolist() == [2]


def test_micro_batches_respect_the_token_budget():
    steps = [_step(prompt=(1,) * (n - 1), completion=(2,)) for n in (9, 3, 5, 5)]
    groups = pack_micro_batches(steps, token_budget=10)
    assert groups == [[1, 2], [3], [0]]  # indices into `steps`, shortest first
    assert [[len(steps[i].prompt_token_ids) + 1 for i in g] for g in groups] == [[3, 5], [5], [9]]
    assert [len(g) for g in pack_micro_batches(steps, token_budget=10, max_train_len=4)] == [2, 2]  # 4 tokens each
    assert [len(g) for g in pack_micro_batches(steps, token_budget=100, max_rows=3)] == [3, 1]
    assert pack_micro_batches(steps, token_budget=10, min_count=4) == [[1], [2], [3], [0]]  # the largest halved
    with pytest.raises(ValueError, match="4 steps cannot make 5 micro-batches"):
        pack_micro_batches(steps, token_budget=10, min_count=5)


def test_micro_batches_remember_the_rows_they_came_from():
    steps = [_step(prompt=(1,) * n, completion=(2,), reward=float(n)) for n in (8, 2, 4, 4)]
    batches = micro_batches(steps, pad_id=0, token_budget=10)
    assert [b.rows.tolist() for b in batches] == [[1, 2], [3], [0]]
    for batch in batches:  # row b of every tensor is steps[rows[b]], equal steps included
        assert batch.rewards.tolist() == [steps[i].reward for i in batch.rows.tolist()]
        assert all(s is steps[i] for s, i in zip(batch.steps, batch.rows.tolist()))


# --- hand-computed losses ---------------------------------------------------------------------------------


def test_normalized_sum_uses_the_constant_or_the_own_length():
    batch, logp = _hand_batch()
    assert normalized_sum(logp, batch.completion_mask, None).tolist() == [-2.0, -4.0]  # (-1 - 3) / 2, -4 / 1
    assert normalized_sum(logp, batch.completion_mask, 4).tolist() == [-1.0, -1.0]


def test_reinforce_loss():
    batch, logp = _hand_batch()
    assert Reinforce().loss(logp, batch, n=2).item() == pytest.approx(-(1 * -2.0 + -1 * -4.0) / 2)
    assert Reinforce(max_generation_len=4).loss(logp, batch, n=2).item() == pytest.approx(0.0)


def test_group_advantages_use_branch_groups_and_fall_back_to_env_and_role():
    steps = [
        _step(reward=1.0, group_id="g"),
        _step(reward=0.0, group_id="g"),
        _step(reward=-1.0, group_id="g"),  # group g: mean 0, population std sqrt(2/3)
        _step(reward=2.0, group_id="lonely"),  # the only one of its group in the batch: falls back
        _step(reward=4.0),  # env E, role 0 with the lonely one: mean 3
        _step(reward=5.0, player_id=1),  # alone in (E, 1): advantage 0
    ]
    advantages, grouped = group_advantages(steps)
    assert advantages == [1.0, 0.0, -1.0, -1.0, 1.0, 0.0] and grouped == 3
    scaled, _ = group_advantages(steps, scale_by_std=True, eps=1e-12)
    assert scaled[:3] == pytest.approx([math.sqrt(1.5), 0.0, -math.sqrt(1.5)])
    assert scaled[3:5] == pytest.approx([-1.0, 1.0])  # std of (2, 4) is 1


def test_ppo_clips_the_ratio_on_a_hand_example():
    batch, _ = _hand_batch()
    # ratios: row 0 tokens 1.5 and 0.9 (A = +1), row 1 token 0.7 (A = -1)
    logp = (batch.behaviour_logprobs + torch.log(torch.tensor([[1.0, 1.5, 0.9], [0.7, 1.0, 1.0]]))).requires_grad_()
    pg_loss, clip_fraction = PPO(clip_eps=0.2).policy_loss(logp, batch)
    row0 = (max(-1.5, -1.2) + max(-0.9, -0.9)) / 2  # -1.05: the 1.5 is clipped to 1.2
    row1 = max(0.7, 0.8) / 1  # 0.8: with A < 0 the pessimistic side is the clipped 0.8
    assert pg_loss.item() == pytest.approx((row0 + row1) / 2)
    assert clip_fraction == pytest.approx(2 / 3)  # 1.5 and 0.7 lie outside [0.8, 1.2]
    pg_loss.backward()
    # only the unclipped token moves: d(-r A / 2 / 2) / d logp = -0.9 / 4
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, 0.0, -0.225, 0.0, 0.0, 0.0], abs=1e-6)


def test_a2c_pg_and_value_loss():
    batch, logp = _hand_batch()
    values = torch.tensor([0.5, -0.2], requires_grad=True)
    pg_loss, value_loss = A2C().loss(logp, values, batch.rewards, batch, n=2)
    assert pg_loss.item() == pytest.approx(-((1 - 0.5) * -2.0 + (-1 + 0.2) * -4.0) / 2)  # A = G - V, G = r
    assert value_loss.item() == pytest.approx(((0.5 - 1) ** 2 + (-0.2 + 1) ** 2) / 2)
    pg_loss.backward()
    assert values.grad is None  # the advantage's V is detached: pg_loss does not train the value


class _ValueOfFirstToken(torch.nn.Module):
    """A value head reading the encodings `_FirstTokenPolicy` makes: V(s) = the state's first prompt token / 10."""

    def forward(self, encodings):
        return encodings[:, 0] / 10


class _FirstTokenPolicy:
    """Just enough of a TrainablePolicy for `A2C.targets`: each row's encoding is its first token."""

    def micro_batches(self, steps):
        return micro_batches(steps, pad_id=0, token_budget=2)  # one state per micro-batch: `rows` puts them back

    def forward(self, batch, encodings=False):
        return PolicyOutput(torch.zeros(batch.completion_mask.shape), encodings=batch.input_ids[:, :1].float())


@pytest.mark.parametrize(
    "bootstrap, expected", [(0.0, [1.0, -1.0, 0.5]), (1.0, [0.7, 0.2, 0.5]), (0.5, [0.85, -0.4, 0.5])]
)
def test_a2c_targets_bootstrap_from_the_players_next_decision(bootstrap, expected):
    steps = [
        _step(reward=1.0, next_prompt_token_ids=(7, 1)),  # V(s') = 0.7
        _step(reward=-1.0, next_prompt_token_ids=(2,)),  # V(s') = 0.2
        _step(reward=0.5),  # the player's last decision: its reward, whatever b
    ]
    algorithm = A2C(bootstrap=bootstrap)
    algorithm.value_head = _ValueOfFirstToken()
    assert algorithm.targets(steps, _FirstTokenPolicy()).tolist() == pytest.approx(expected)


def test_a2c_bootstraps_from_the_next_prompt_the_buffer_links_each_step_to():
    # player 0 decides in states 7, 3 and 1 (V = 0.7, 0.3, 0.1); player 1 in state 5 only; player 0 wins
    steps = tuple(
        _step(prompt=(p,), player_id=pid, turn=t) for t, (pid, p) in enumerate([(0, 7), (1, 5), (0, 3), (0, 1)])
    )
    buffer = StepBuffer(BufferConfig(max_buffer_size=8))
    buffer.add_game(GameRecord("E", 0, {0: "a", 1: "b"}, steps, {0: 1.0, 1: -1.0}, learner_player_ids=(0, 1)))
    batch = sorted(buffer.get_batch(4), key=lambda s: s.turn)
    algorithm = A2C(bootstrap=1.0)
    algorithm.value_head = _ValueOfFirstToken()
    # TD(0): each decision's target is the value of its player's next state; a player's last decision, its reward
    assert algorithm.targets(batch, _FirstTokenPolicy()).tolist() == pytest.approx([0.3, -1.0, 0.1, 1.0])


@pytest.mark.parametrize("bootstrap", [-0.1, 1.5])
def test_a2c_refuses_a_bootstrap_weight_outside_zero_to_one(bootstrap):
    with pytest.raises(ValueError, match="bootstrap"):
        A2C(bootstrap=bootstrap)


def test_one_step_vtrace_and_awr_weights():
    out = one_step_vtrace(
        logp=torch.tensor([-1.5, 0.0]),
        behaviour_logp=torch.tensor([-1.0, -1.0]),
        rewards=torch.tensor([1.0, -1.0]),
        values=torch.tensor([0.2, 0.5]),
        rho_bar=1.0,
    )
    rho = math.exp(-0.5)  # the second decision's weight e^1 is truncated to 1
    assert out.rhos[:, 0].tolist() == pytest.approx([rho, 1.0])
    assert out.vs[:, 0].tolist() == pytest.approx([0.2 + rho * 0.8, -1.0])  # V + rho (r - V)
    assert out.advantages[:, 0].tolist() == pytest.approx([rho * 0.8, -1.5])  # rho (r - V)
    weights = awr_weights(torch.tensor([1.0, -1.0]), temperature=1.0)
    assert weights.tolist() == pytest.approx([2 * E / (E + 1 / E), 2 / E / (E + 1 / E)])  # mean 1


def test_vtrace_awr_loss_terms():
    batch, logp = _hand_batch()
    weights = torch.tensor([1.5, 0.5])
    values, targets = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])
    awr_loss, kl, value_mse = VTraceAWR().loss(logp, values, batch, weights, targets)
    assert awr_loss.item() == pytest.approx(-(1.5 * -2.0 + 0.5 * -4.0) / 2)
    k3 = [0.0, math.exp(-1) - 1 + 1, math.exp(-3.5) - 1 + 3.5]  # (r - 1) - log r at log r = 0, -1, -3.5
    assert kl.item() == pytest.approx(sum(k3) / 3)
    assert value_mse.item() == pytest.approx(0.5)


# --- the tiny model: a two-action text bandit ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bandit(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    encode = lambda text: tuple(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return {
        "prompt": encode("Available Moves: '[0]', '[1]'\nYour move: "),
        "other_prompt": encode("Current Board: 0 | 1 | 2\nYour move: "),
        "good": encode("\\boxed{[1]}"),
        "bad": encode("\\boxed{[0]}"),
    }


def _learner(tiny_model_dir, algorithm, **kw):
    options = {"lora": LoraConfig(lora_rank=4), "learning_rate": 0.005, "micro_batch_tokens": 512, "num_threads": 1}
    cfg = LearnerConfig(**nest_flat_fields(options | kw))  # StandardLearner-style keywords
    learner = Learner.build(tiny_model_dir, algorithm, cfg)
    torch.manual_seed(0)  # the LoRA initialisation
    learner.initialize()
    return learner


def _scored(learner, prompt, completion, reward, shift=0.0, **kw):
    """A step whose behaviour log-probs are the learner's current ones minus `shift`."""
    step = _step(prompt=prompt, completion=completion, reward=reward, **kw)
    with torch.no_grad():
        batch = collate([step], learner.policy.pad_id)
        logp = learner.forward(batch).logprobs[batch.completion_mask.bool()]  # (n_completion,)
    return _step(prompt=prompt, completion=completion, behaviour=(logp - shift).tolist(), reward=reward, **kw)


def _bandit_batch(learner, bandit, copies=4):
    """`copies` samples of each action from the current policy: +1 for the good one, -1 for the bad one."""
    good = _scored(learner, bandit["prompt"], bandit["good"], 1.0, group_id="g")
    bad = _scored(learner, bandit["prompt"], bandit["bad"], -1.0, group_id="g")
    return [good] * copies + [bad] * copies


def _margin(learner, bandit):
    """log pi(good) - log pi(bad) on the bandit prompt."""
    good, bad = (_scored(learner, bandit["prompt"], c, 0.0) for c in (bandit["good"], bandit["bad"]))
    return sum(good.behaviour_logprobs) - sum(bad.behaviour_logprobs)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("reinforce", {}),
        ("group_baseline", {"scale_by_std": True}),
        ("ppo", {"epochs": 2, "minibatch_size": 4}),
        ("a2c", {}),
        ("vtrace_awr", {"awr_temperature": 0.5}),
        ("mmd", {"eta": 1.0, "alpha": 0.1}),
    ],
)
def test_each_algorithm_learns_the_two_action_bandit(tiny_model_dir, bandit, name, args):
    learner = _learner(tiny_model_dir, ALGORITHMS[name](**args))
    before = _margin(learner, bandit)
    for _ in range(20):
        metrics = learner.train_step(_bandit_batch(learner, bandit))
    assert _margin(learner, bandit) - before > 1.5  # p(good) / p(bad) grew by more than e^1.5
    assert all(math.isfinite(v) for v in metrics.values())
    # on-policy data: ratio 1, up to what PPO's earlier minibatches of its first epoch moved
    assert metrics["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-4 if name != "ppo" else 0.05)


def test_mmd_weights_are_each_prompts_mirror_descent_target_over_its_sampled_moves():
    """`MagneticMirrorDescent.target_weights`: the moves at one prompt pooled, each distinct move credited with its mean
    reward there, the target mu^(1/(1+a e)) exp(e Q/(1+a e)) rho^(a e/(1+a e)) over the distinct moves, each step
    weighted n_s target(a) / n_(s,a); a shift of every reward at a prompt changes nothing; a prompt where one move
    was sampled weighs 0."""
    algo = MagneticMirrorDescent(eta=2.0, alpha=0.5)
    mu, rho = {(3,): 0.75, (4,): 0.25}, {(3,): 0.5, (4,): 0.5}
    samples = [((3,), 1.5), ((3,), 0.5), ((3,), 1.0), ((4,), -1.0)]  # Q(3) = 1, Q(4) = -1
    steps = [_step(completion=c, behaviour=(math.log(mu[c]),), reward=r + 5.0) for c, r in samples]
    steps.append(_step(prompt=(9,), completion=(3,), reward=3.0))  # alone at its prompt
    weights = algo.target_weights(steps, [math.log(rho[c]) for c, _ in samples] + [0.0])
    q = {(3,): 1.0, (4,): -1.0}
    target = {c: mu[c] ** (1 / 2) * math.exp(2 * q[c] / 2) * rho[c] ** (1 / 2) for c in mu}  # alpha eta = 1
    total = sum(target.values())
    counts = {(3,): 3, (4,): 1}
    assert weights == pytest.approx([4 * target[c] / total / counts[c] for c, _ in samples] + [0.0])
    with pytest.raises(ValueError, match="eta"):
        MagneticMirrorDescent(eta=0.0)


def test_mmd_uncontested_prompts_take_the_magnets_step_alone_or_nothing():
    """`uncontested="magnet"`: a prompt where one move was sampled gets t = mu^c rho^(1-c) / (that + (1-mu)^c
    (1-rho)^(1-c)), c = 1/(1+alpha eta), on its log pi and 1 - t on log(1 - pi); a contested prompt's weights are
    as without it; "skip" gives the uncontested prompt nothing."""
    steps = [
        _step(completion=(3,), behaviour=(math.log(0.75),), reward=1.0),
        _step(completion=(4,), behaviour=(math.log(0.25),), reward=-1.0),
        _step(prompt=(9,), completion=(3,), behaviour=(math.log(0.9),)),  # alone at its prompt
    ]
    magnet = [math.log(0.5)] * 3
    skip, pull = MagneticMirrorDescent(eta=2.0, alpha=0.5), MagneticMirrorDescent(2.0, 0.5, uncontested="magnet")
    t = math.sqrt(0.9 * 0.5) / (math.sqrt(0.9 * 0.5) + math.sqrt(0.1 * 0.5))  # c = 1/2
    assert t == pytest.approx(0.75)
    assert pull.target_weights(steps, magnet) == pytest.approx(skip.target_weights(steps, magnet)[:2] + [t])
    assert pull.rest_weights(steps, pull.target_weights(steps, magnet)) == pytest.approx([0, 0, 1 - t])
    assert skip.target_weights(steps, magnet)[2] == 0.0
    assert skip.rest_weights(steps, skip.target_weights(steps, magnet)) == [0.0] * 3
    with pytest.raises(ValueError, match="uncontested"):
        MagneticMirrorDescent(uncontested="always")


def test_mmd_pulls_a_saturated_prompt_back_toward_the_magnet_only_with_uncontested_magnet(tiny_model_dir, bandit):
    """A policy taught one move far past the magnet (the warm start) and then sampling only that move: with
    "skip" the update has no gradient (Adam's momentum alone moves it); with "magnet" the move's log-odds fall
    back further."""

    def odds(learner):
        good = _scored(learner, bandit["prompt"], bandit["good"], 0.0)
        p = math.exp(sum(good.behaviour_logprobs))
        return math.log(p / (1 - p))

    moved, grad_norms = {}, {}
    for uncontested in ("skip", "magnet"):
        learner = _learner(tiny_model_dir, MagneticMirrorDescent(eta=1.0, alpha=0.1, uncontested=uncontested))
        for _ in range(10):  # contested batches: both moves sampled, the good one worth 2 more
            learner.train_step(_bandit_batch(learner, bandit))
        before = odds(learner)
        only_good = [_scored(learner, bandit["prompt"], bandit["good"], 1.0)] * 8
        metrics = learner.train_step(only_good)
        moved[uncontested], grad_norms[uncontested] = odds(learner) - before, metrics["learner/grad_norm"]
        assert metrics["learner/grouped_fraction"] == 0.0
    assert grad_norms["skip"] == 0.0 < grad_norms["magnet"]
    assert moved["magnet"] < moved["skip"] - 0.01


def test_mmd_scores_under_the_magnet_only_the_moves_at_prompts_with_a_target():
    """`MagneticMirrorDescent.magnet_logprobs`: the reference pass runs over the steps whose prompt saw two or more
    distinct moves, each step's summed completion log-prob put back in place; the others score 0 without a pass."""
    steps = [_step(completion=(3,)), _step(completion=(4, 5)), _step(prompt=(9,)), _step(completion=(3,))]

    class Reference:
        scored: list[Step] = []

        def micro_batches(self, batch_steps):
            self.scored = batch_steps
            return [collate(batch_steps, 0)]

        def reference_logprobs(self, batch):
            return -0.5 * torch.ones_like(batch.completion_mask)  # (B, L-1)

    reference = Reference()
    assert MagneticMirrorDescent().magnet_logprobs(steps, reference) == [-0.5, -1.0, 0.0, -0.5]
    assert reference.scored == [steps[0], steps[3], steps[1]]
    assert MagneticMirrorDescent(alpha=0.0).magnet_logprobs(steps, None) == [0.0] * 4


@pytest.mark.parametrize("lora", [LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"]), None])
def test_reference_policy_is_the_starting_weights_and_the_ref_kl_holds_the_policy_near_it(tiny_model_dir, bandit, lora):
    def drift(coef):
        learner = _learner(tiny_model_dir, Reinforce(ref_kl_coef=coef), lora=lora, learning_rate=0.002)
        batch = collate([_step(prompt=bandit["prompt"], completion=bandit["good"])], learner.policy.pad_id)
        with torch.no_grad():
            torch.testing.assert_close(learner.reference_logprobs(batch), learner.forward(batch).logprobs)
        for _ in range(8):
            metrics = learner.train_step(_bandit_batch(learner, bandit))
        assert metrics[keys.REF_KL] >= 0 and math.isfinite(metrics[keys.LOSS])
        assert metrics[keys.LOSS] == pytest.approx(metrics[keys.PG_LOSS] + metrics[keys.REF_KL_LOSS])
        return _margin(learner, bandit)

    held, free = drift(1.0), drift(0.0)
    assert held < free  # the penalty slowed the move away from the starting weights


def test_vtrace_awr_kl_multiplier_follows_the_target_and_ratios_are_logged(tiny_model_dir, bandit):
    coefs = {}
    for target in (1e-4, 10.0):
        learner = _learner(tiny_model_dir, VTraceAWR(kl_target=target, kl_coef_init=0.1, kl_coef_lr=0.1))
        # behaviour log-probs 0.5 below the current ones on every token: each ratio is e^0.5
        steps = [_scored(learner, bandit["prompt"], bandit["good"], 1.0, shift=0.5)] * 4
        metrics = learner.train_step(steps)
        assert metrics["learner/ratio_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
        assert metrics["learner/ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-4)
        assert metrics["learner/rho_mean"] == pytest.approx(1.0)  # e^(0.5 * 5 tokens) truncated at rho_bar
        assert metrics["learner/approx_kl"] == pytest.approx(math.expm1(0.5) - 0.5, rel=1e-3)
        coefs[target] = metrics["learner/kl_coef"]
    assert coefs[1e-4] > 0.1 > coefs[10.0]  # up while KL is above the target, down while below


def test_vtrace_awr_fits_values_on_the_cache_with_two_forward_passes_per_update(tiny_model_dir, bandit):
    learner = _learner(tiny_model_dir, VTraceAWR(vf_pre_epochs=5, vf_post_epochs=5, vf_lr=0.01, vf_minibatch_size=4))
    forwards = []
    forward = learner.forward
    learner.forward = lambda batch, **kw: forwards.append(1) or forward(batch, **kw)
    value_losses = []
    for _ in range(8):
        winning = _scored(learner, bandit["prompt"], bandit["good"], 1.0)
        losing = _scored(learner, bandit["other_prompt"], bandit["good"], -1.0)  # reward depends on the state
        forwards.clear()
        metrics = learner.train_step([winning] * 4 + [losing] * 4)
        assert len(forwards) == 2  # the cached pass and the policy pass (one micro-batch each)
        value_losses.append((metrics["learner/vf_pre_loss"], metrics["learner/vf_post_loss"]))
    # V = 0 everywhere scores 1.0; the first update's loss is a mean over its 5 fitting epochs
    assert value_losses[-1][1] < 0.05 and value_losses[-1][1] < value_losses[0][0] / 4


def test_a2c_value_head_joins_the_optimizer(tiny_model_dir):
    algorithm = A2C(value_lr=0.005)
    learner = _learner(tiny_model_dir, algorithm)
    head_params = set(algorithm.value_head.parameters())
    groups = learner.optimizer.param_groups
    assert groups[-1]["lr"] == 0.005 and set(groups[-1]["params"]) == head_params


# --- staleness ----------------------------------------------------------------------------------------------


def test_stale_samples_are_dropped_and_counted(tiny_model_dir, tmp_path, bandit):
    pool = ModelPool()
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=16))
    learner = _learner(tiny_model_dir, Reinforce(), batch_size=4, max_staleness=2)
    loop = LearnerLoop(learner, buffer, pool, Tracker(tmp_path), str(tmp_path))
    learner.step = 5  # as if five updates had been made
    versions = [5, 4, 2, -1]  # staleness 0, 1, 3, 5 (the base model counts as version 0)
    steps = [_step(policy_version=v, reward=1.0) for v in versions]
    assert [learner.staleness(s) for s in steps] == [0, 1, 3, 5]
    assert learner.drop_stale(steps) == (steps[:2], 2)
    buffer.steps.extend(steps)
    row = loop.train(1)[0]
    assert row["learner/stale_dropped"] == 2 and row["learner/batch_size"] == 2
    assert row["learner/staleness_max"] == 1 and row["learner/step"] == 6


# --- configuration ------------------------------------------------------------------------------------------


def test_config_carries_algorithm_args_staleness_bound_and_group_size():
    data = {
        "model": {"path": "m"},
        "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]], "group_size": 4},
        "learner": {"max_staleness": 2, "algorithm": {"name": "vtrace_awr", "args": {"awr_temperature": 0.5}}},
    }
    cfg = validate_config(data)
    assert cfg.collector.group_size == 4 and cfg.learner.max_staleness == 2
    assert ALGORITHMS[cfg.learner.algorithm.name](**cfg.learner.algorithm.args).awr_temperature == 0.5
    data["collector"]["group_size"] = 0
    with pytest.raises(ConfigError, match="collector.group_size = 0"):
        validate_config(data)


def test_vtrace_awr_takes_the_names_of_unstable_rl_and_refuses_the_old_ones():
    """The knobs `VTraceAWR` shares with `unstable.rl.TrainerConfig` carry its names; an old name fails naming the
    new one (not a silent alias)."""
    shared = set(inspect.signature(VTraceAWR).parameters) & {f.name for f in dataclasses.fields(TrainerConfig)}
    assert {"awr_temperature", "awr_exponent_clip", "vtrace_rho_max", "vf_loss_coef", "vf_pre_epochs"} <= shared
    data = {
        "model": {"path": "m"},
        "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]},
        "learner": {"algorithm": {"name": "vtrace_awr", "args": {"temperature": 0.5}}},
    }
    with pytest.raises(ConfigError, match="'temperature' is now awr_temperature"):
        validate_config(data)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tempo'"):
        VTraceAWR(tempo=1)


# --- state for resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["reinforce", "ppo", "a2c", "vtrace_awr"])
def test_learner_state_dict_restores_everything_it_owns(tiny_model_dir, bandit, name):
    learner = _learner(tiny_model_dir, ALGORITHMS[name]())
    learner.train_step(_bandit_batch(learner, bandit))
    state = copy.deepcopy(learner.state_dict())
    batch = _bandit_batch(learner, bandit)
    expected = learner.train_step(batch)

    torch.manual_seed(1)  # other LoRA and value-head initialisations: loading must overwrite them
    fresh = Learner.build(tiny_model_dir, ALGORITHMS[name](), learner.cfg)
    fresh.load_state_dict(state)
    assert fresh.step == 1
    restored = fresh.train_step(batch)  # the same update from the same state gives the same result
    assert restored[keys.LOSS] == pytest.approx(expected[keys.LOSS], rel=1e-5, abs=1e-7)
    for key, value in learner.policy.trainable_state().items():
        torch.testing.assert_close(fresh.policy.trainable_state()[key], value)
    assert all(isinstance(v, float | int) for v in expected.values()) and keys.LOSS in expected


def test_algorithms_train_through_the_interface_not_the_learner():
    class FakePolicy:
        """The smallest TrainablePolicy: a lookup table of log-probs for two completions."""

        device, hidden_size = "cpu", 4

        def __init__(self):
            self.table = torch.zeros(2, requires_grad=True)
            self.steps_taken = 0

        def shard(self, steps):
            return steps

        def micro_batches(self, steps):
            return micro_batches(steps, pad_id=0, token_budget=100)

        def forward(self, batch, *, encodings=False, entropy=False):
            logp = torch.log_softmax(self.table, 0)[batch.input_ids[:, 1:] - 1]  # (B, L-1)
            return PolicyOutput(logp, torch.zeros(len(batch.rows), 4) if encodings else None)

        def reference_logprobs(self, batch):
            return torch.log_softmax(torch.zeros(2), 0)[batch.input_ids[:, 1:] - 1]  # (B, L-1) uniform reference

        def track_ratios(self, logprobs, batch):
            pass

        def add_parameters(self, params, lr=None):
            pass

        def optimizer_step(self):
            with torch.no_grad():
                self.table -= self.table.grad
            self.table.grad = None
            self.steps_taken += 1
            return 0.0

    policy = FakePolicy()
    steps = [_step(prompt=(1,), completion=(2,), reward=1.0), _step(prompt=(1,), completion=(1,), reward=-1.0)]
    metrics = Reinforce(ref_kl_coef=0.1).update(steps, policy)  # the KL term reaches the reference through it too
    assert policy.steps_taken == 1 and keys.LOSS in metrics
    assert metrics[keys.REF_KL] == pytest.approx(0.0, abs=1e-6)  # it started at the (uniform) reference
    assert policy.table[1] > policy.table[0]  # the rewarded completion (token 2) became more likely


@pytest.mark.parametrize("chunk", [1, 4096])
def test_policy_log_probs_equal_a_full_vocabulary_softmax_without_building_one(tiny_model_dir, bandit, chunk):
    cfg = PolicyConfig(lora=LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"]), logit_chunk_tokens=chunk)
    policy = PolicyModel(tiny_model_dir, cfg)
    torch.manual_seed(0)
    policy.load()
    completions = (bandit["good"], bandit["other_prompt"][:3])
    steps = [_step(prompt=bandit["prompt"], completion=c, temperature=0.7) for c in completions]  # sampled at 0.7
    batch = collate(steps, policy.pad_id)
    out = policy.forward(batch, encodings=True, entropy=True)
    with torch.no_grad():
        full = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    logp_all = torch.log_softmax(full.logits[:, :-1].float() / 0.7, -1)  # (B, L-1, V)
    expected = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) * batch.completion_mask  # (B, L-1)
    torch.testing.assert_close(out.logprobs, expected, atol=1e-5, rtol=1e-5)
    entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.completion_mask
    torch.testing.assert_close(out.entropy, entropy, atol=1e-5, rtol=1e-5)
    rows = torch.arange(2)
    torch.testing.assert_close(out.encodings, full.hidden_states[-1][rows, decision_positions(batch)])


@pytest.mark.parametrize("chunk", [1, 4096])
def test_top_p_log_probs_renormalise_over_the_learners_own_nucleus_and_the_target(tiny_model_dir, bandit, chunk):
    """Each row is scored under its own sampling settings: log p_T(t) - log of the mass of the current top-p
    nucleus plus t (greedy rows: temperature 1, no cut). A target outside the nucleus keeps a finite log-prob and
    gradient."""
    cfg = PolicyConfig(lora=LoraConfig(lora_rank=4, target_modules=["q_proj", "lm_head"]), logit_chunk_tokens=chunk)
    policy = PolicyModel(tiny_model_dir, cfg)
    torch.manual_seed(0)
    policy.load()
    settings = [(0.7, 0.5), (1.3, 1.0), (0.0, 0.5), (1.0, 0.3)]  # (temperature, top_p) per row
    completions = (bandit["good"], bandit["bad"], bandit["other_prompt"][:3], bandit["bad"])
    steps = [
        _step(prompt=bandit["prompt"], completion=c, temperature=t, top_p=p) for c, (t, p) in zip(completions, settings)
    ]
    batch = collate(steps, policy.pad_id)
    out = policy.forward(batch)
    with torch.no_grad():
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    expected, outside = torch.zeros_like(out.logprobs), 0
    for row, col in batch.completion_mask.nonzero().tolist():
        temperature, top_p = settings[row] if settings[row][0] > 0 else (1.0, 1.0)  # greedy: temperature 1, no cut
        probs = torch.softmax(logits[row, col] / temperature, -1)  # (V,)
        ranked, order = probs.sort(descending=True)
        nucleus = set(order[: int((ranked.cumsum(0) - ranked < top_p).sum())].tolist()) if top_p < 1 else set()
        target = int(batch.input_ids[row, col + 1])
        outside += top_p < 1 and target not in nucleus
        support = list(nucleus | {target}) if top_p < 1 else slice(None)
        expected[row, col] = torch.log(probs[target] / probs[support].sum())
    assert outside > 0  # some targets left the nucleus: scored over the nucleus plus themselves
    torch.testing.assert_close(out.logprobs.detach(), expected, atol=1e-5, rtol=1e-5)
    out.logprobs.sum().backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_packed_sequences_and_bf16_autocast_give_the_padded_float32_log_probs(tiny_model_dir, bandit):
    """`layout: packed` runs the decoder on the real tokens only (one row, position ids restarting per sequence):
    the log-probs and encodings equal the padded batch's; bf16 autocast stays within bf16's precision."""
    steps = [_step(prompt=bandit["prompt"], completion=c) for c in (bandit["good"], bandit["other_prompt"][:3])]
    outputs = {}
    for name, options in {
        "padded": {"layout": "padded"},
        "packed": {"layout": "packed"},
        "bf16": {"autocast_dtype": "bfloat16"},
    }.items():
        policy = PolicyModel(tiny_model_dir, PolicyConfig(lora=None, **options))
        policy.load()
        batch = collate(steps, policy.pad_id)
        with torch.no_grad():
            outputs[name] = policy.forward(batch, encodings=True)
    assert batch.attention_mask.sum() < batch.attention_mask.numel()  # the batch has padding to skip
    torch.testing.assert_close(outputs["packed"].logprobs, outputs["padded"].logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs["packed"].encodings, outputs["padded"].encodings, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs["bf16"].logprobs, outputs["padded"].logprobs, atol=0.1, rtol=0.05)
    assert not torch.equal(outputs["bf16"].logprobs, outputs["padded"].logprobs)  # autocast did run in bf16


@pytest.mark.parametrize("lora", [None, LoraConfig(lora_rank=4)], ids=["full", "lora"])
def test_shared_prompts_give_the_padded_log_probs_encodings_entropies_and_gradients(tiny_model_dir, bandit, lora):
    """`layout: shared-prompts` (the default) runs the rows' common opening once, each distinct prompt once and each
    row from its decision position on: a batch of vines (one prompt, several completions of different lengths),
    another prompt with the same opening, one with none in common past the first token, and a completion cut off by
    `max_train_len`, scores as the padded batch does, and its loss's gradients are the padded batch's."""
    opening, board = bandit["prompt"], bandit["other_prompt"]
    steps = [_step(prompt=opening, completion=c) for c in (bandit["good"], bandit["bad"][:2], bandit["good"][:1])]
    steps += [_step(prompt=opening + board, completion=bandit["bad"]), _step(prompt=opening[:1] + board[::-1])]
    steps += [_step(prompt=opening + board + board, completion=bandit["good"], temperature=0.7, top_p=0.9)]
    results = {}
    for layout in ("padded", "shared-prompts"):
        torch.manual_seed(0)
        policy = PolicyModel(tiny_model_dir, PolicyConfig(lora=lora, layout=layout))
        policy.load()
        batch = collate(steps, policy.pad_id, max_train_len=len(opening + board + board) + 1)
        out = policy.forward(batch, encodings=True, entropy=True)
        (out.logprobs.sum() + out.encodings.sum() + out.entropy.sum()).backward()
        grads = {name: p.grad.clone() for name, p in policy.model.named_parameters() if p.grad is not None}
        results[layout] = (out, grads)
    (padded, padded_grads), (shared, shared_grads) = results["padded"], results["shared-prompts"]
    assert len(set(share_prompts(batch).leaf.tolist())) == 4  # the vines' prompt is run once for its three rows
    for name in ("logprobs", "encodings", "entropy"):
        torch.testing.assert_close(getattr(shared, name), getattr(padded, name), atol=1e-5, rtol=1e-5)
    assert shared_grads.keys() == padded_grads.keys() and shared_grads
    for name, grad in padded_grads.items():  # float32 sums in another order: equal up to ~1e-6 of their size
        assert (shared_grads[name] - grad).norm() <= 1e-5 * grad.norm(), name


def test_shared_prompts_cut_a_batch_into_a_tree_of_its_prompts_and_suffixes():
    """`share_prompts`: the prompts' common tokens once, then one node per way they go on, a prompt that ended
    carried down as a node of no tokens; each row from its decision position on; the prompt tree at most
    `max_levels` deep, each prompt's rest whole at the last; None when a prompt is empty (nothing to share)."""
    steps = [_step(prompt=(7, 8, 9), completion=(1, 2)), _step(prompt=(7, 8, 9), completion=(3,))]
    steps += [_step(prompt=(7, 8, 5, 6, 4), completion=(4,)), _step(prompt=(7, 8, 5, 6, 3, 2), completion=(4,))]
    steps += [_step(prompt=(7, 8), completion=(5,))]
    shared = share_prompts(collate(steps, pad_id=0))
    levels = [(lv.parent.tolist(), lv.ids.tolist(), lv.mask.tolist(), lv.offsets.tolist()) for lv in shared.levels]
    # the prompts up to the decision positions: (7, 8) twice, (7, 8, 5, 6), (7, 8, 5, 6, 3) and (7,)
    assert levels[0] == ([0], [[7]], [[1]], [0])
    assert levels[1] == ([0, 0], [[0], [8]], [[0], [1]], [1, 1])  # (7,) ends; the others go on with 8
    assert levels[2] == ([0, 1, 1], [[0, 0], [0, 0], [5, 6]], [[0, 0], [0, 0], [1, 1]], [1, 2, 2])
    assert levels[3] == ([0, 1, 2, 2], [[0], [0], [0], [3]], [[0], [0], [0], [1]], [1, 2, 4, 4])
    assert shared.leaf.tolist() == [1, 1, 2, 3, 0] and shared.starts.tolist() == [2, 2, 4, 5, 1]
    assert shared.suffix_ids.tolist() == [[9, 1, 2], [9, 3, 0], [4, 4, 0], [2, 4, 0], [8, 5, 0]]
    flat = share_prompts(collate(steps, pad_id=0), max_levels=2)
    assert [lv.ids.tolist() for lv in flat.levels] == [[[7]], [[0, 0, 0, 0], [8, 0, 0, 0], [8, 5, 6, 0], [8, 5, 6, 3]]]
    assert share_prompts(collate([_step(prompt=(7,)), *steps], pad_id=0)) is None


# --- learning-rate schedule ---------------------------------------------------------------------------------


def test_lr_schedules_warm_up_then_decay_to_the_floor():
    from unstable.learner.schedule import lr_factor

    assert [lr_factor(k, 5, "constant") for k in range(5)] == [1.0] * 5
    assert [lr_factor(k, 5, "linear") for k in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert [lr_factor(k, 5, "cosine", min_lr_ratio=0.2) for k in (0, 2, 4)] == pytest.approx([1.0, 0.6, 0.2])
    assert [lr_factor(k, 6, "linear", warmup_steps=2) for k in range(6)] == pytest.approx(
        [0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0]
    )
    with pytest.raises(ValueError, match="lr_schedule"):
        LearnerConfig(optimizer={"lr_schedule": "exponential"})


def test_learner_follows_the_schedule_in_every_group_and_after_a_restore(tiny_model_dir, bandit):
    learner = _learner(tiny_model_dir, A2C(), num_steps=3, lr_schedule="linear")  # A2C adds a value-head group
    rates = [learner.train_step(_bandit_batch(learner, bandit))[keys.LEARNING_RATE] for _ in range(2)]
    assert rates == pytest.approx([0.005, 0.0025])
    assert all(group["lr"] == pytest.approx(group["base_lr"] / 2) for group in learner.optimizer.param_groups)
    fresh = _learner(tiny_model_dir, A2C(), num_steps=3, lr_schedule="linear")
    fresh.load_state_dict(copy.deepcopy(learner.state_dict()))
    assert fresh.train_step(_bandit_batch(fresh, bandit))[keys.LEARNING_RATE] == pytest.approx(0.0)


def test_steps_whose_completion_max_train_len_cuts_off_are_left_out_with_a_count(tiny_model_dir):
    """A step whose prompt fills `learner.policy.max_train_len` keeps no completion token to train on: it is left out
    of the update and counted (a micro-batch of only such steps crashed backward() before); a batch of nothing but
    such steps stops the update, naming the setting."""
    learner = _learner(tiny_model_dir, Reinforce(), max_train_len=6)
    cut = _step(prompt=tuple(range(10, 18)), completion=(3, 4), reward=1.0)  # 8 prompt tokens: nothing left
    kept = _step(prompt=(1, 2), completion=(3, 4), reward=1.0)
    metrics = learner.train_step([cut, kept, cut])
    assert metrics[keys.TRUNCATED_DROPPED] == 2 and metrics[keys.BATCH_SIZE] == 1 and learner.step == 1
    with pytest.raises(RuntimeError, match=r"learner\.policy\.max_train_len = 6"):
        learner.train_step([cut])
