"""The shared RL math in `unstable.rl` against plain-Python references and hand-computed numbers."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from unstable.rl import (
    KLController,
    RunningMeanStd,
    approx_kl,
    awr_weights,
    discounted_returns,
    masked_mean,
    masked_whiten,
    vtrace,
    weighted_nll_loss,
)

NAN = float("nan")


# --- plain-Python references -------------------------------------------------------------------------------


def reference_vtrace(logp_t, logp_b, rewards, values, bootstrap, dones, gamma, lam, rho_bar, c_bar):
    """One row of IMPALA's V-trace written as its explicit sum (not the recursion), plus the advantages."""
    n = len(rewards)
    w = [math.exp(a - b) for a, b in zip(logp_t, logp_b)]
    rho = [min(x, rho_bar) for x in w]
    c = [lam * min(x, c_bar) for x in w]
    v_next = values[1:] + [bootstrap]
    delta = [rho[t] * (rewards[t] + gamma * (1 - dones[t]) * v_next[t] - values[t]) for t in range(n)]
    vs = []
    for s in range(n):
        total, trace = 0.0, 1.0
        for t in range(s, n):
            total += gamma ** (t - s) * trace * delta[t]
            trace *= c[t] * (1 - dones[t])
        vs.append(values[s] + total)
    vs_next = vs[1:] + [bootstrap]
    adv = [rho[t] * (rewards[t] + gamma * (1 - dones[t]) * vs_next[t] - values[t]) for t in range(n)]
    return vs, adv, rho, c


def reference_td_lambda(rewards, values, bootstrap, dones, gamma, lam):
    """One row of the TD(lambda) return G_t = r_t + gamma (1 - d_t) [(1 - lam) V_{t+1} + lam G_{t+1}]."""
    v_next = values[1:] + [bootstrap]
    out, g = [0.0] * len(rewards), bootstrap
    for t in reversed(range(len(rewards))):
        g = rewards[t] + gamma * (1 - dones[t]) * ((1 - lam) * v_next[t] + lam * g)
        out[t] = g
    return out


def random_batch(batch, horizon, seed, on_policy=False):
    """Right-padded random inputs with NaN in the padding, dones mid-row and random bootstrap values."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, horizon) for _ in range(batch)]
    lengths[0] = horizon
    rows = []
    for n in lengths:
        logp_b = [rng.uniform(-3, 0) for _ in range(n)]
        logp_t = logp_b if on_policy else [x + rng.uniform(-1.5, 1.5) for x in logp_b]
        dones = [float(rng.random() < 0.25) for _ in range(n)]
        rows.append(
            {
                "logp_t": logp_t,
                "logp_b": logp_b,
                "dones": dones,
                "rewards": [rng.uniform(-1, 1) for _ in range(n)],
                "values": [rng.uniform(-1, 1) for _ in range(n)],
                "bootstrap": 0.0 if dones[-1] else rng.uniform(-1, 1),
            }
        )

    def pad(key):
        return torch.tensor([r[key] + [NAN] * (horizon - len(r[key])) for r in rows], dtype=torch.float64)

    tensors = {
        "logp_target": pad("logp_t"),
        "logp_behaviour": pad("logp_b"),
        "rewards": pad("rewards"),
        "values": pad("values"),
        "dones": pad("dones"),
        "bootstrap_value": torch.tensor([r["bootstrap"] for r in rows], dtype=torch.float64),
        "mask": torch.tensor([[t < n for t in range(horizon)] for n in lengths]),
    }
    return rows, tensors


def assert_rows(actual, expected_rows, horizon):
    """`actual` (B, T) equals the per-row lists on the valid steps and 0 on the padding."""
    for row, expected in zip(actual.tolist(), expected_rows):
        assert row[: len(expected)] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert row[len(expected) :] == [0.0] * (horizon - len(expected))


# --- V-trace -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,horizon,seed", [(1, 1, 0), (3, 4, 1), (5, 7, 2), (8, 12, 3)])
@pytest.mark.parametrize("gamma,lam,rho_bar,c_bar", [(0.9, 1.0, 1.0, 1.0), (0.97, 0.8, 1.5, 0.7), (1.0, 0.5, 0.5, 2.0)])
def test_vtrace_matches_plain_python_impala(batch, horizon, seed, gamma, lam, rho_bar, c_bar):
    rows, inputs = random_batch(batch, horizon, seed)
    out = vtrace(**inputs, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    refs = [
        reference_vtrace(
            r["logp_t"], r["logp_b"], r["rewards"], r["values"], r["bootstrap"], r["dones"], gamma, lam, rho_bar, c_bar
        )
        for r in rows
    ]
    for i, name in enumerate(["vs", "advantages", "rhos", "cs"]):
        assert_rows(getattr(out, name), [ref[i] for ref in refs], horizon)


def test_vtrace_clipping_is_active_in_random_inputs():
    _, inputs = random_batch(8, 12, 3)
    w = torch.exp(inputs["logp_target"] - inputs["logp_behaviour"])[inputs["mask"]]
    assert (w > 1.5).any() and (w < 0.5).any()


def test_vtrace_two_step_hand_example():
    # gamma 0.9, lam 1, rho_bar = c_bar = 1, truncated after 2 steps with bootstrap value 3.
    # w = [2, 0.5] -> rho = c = [1, 0.5]; r = [1, 2]; V = [0.5, 1.0]
    # delta_1 = 0.5 * (2 + 0.9 * 3 - 1)   = 1.85         vs_1 = 1.0 + 1.85 = 2.85
    # delta_0 = 1.0 * (1 + 0.9 * 1 - 0.5) = 1.4          vs_0 = 0.5 + 1.4 + 0.9 * 1 * 1.85 = 3.565
    # A_1 = 0.5 * (2 + 0.9 * 3 - 1) = 1.85               A_0 = 1 * (1 + 0.9 * 2.85 - 0.5) = 3.065
    out = vtrace(
        logp_target=torch.tensor([[math.log(2.0), math.log(0.5)]]),
        logp_behaviour=torch.zeros(1, 2),
        rewards=torch.tensor([[1.0, 2.0]]),
        values=torch.tensor([[0.5, 1.0]]),
        bootstrap_value=torch.tensor([3.0]),
        dones=torch.zeros(1, 2),
        mask=torch.ones(1, 2, dtype=torch.bool),
        gamma=0.9,
    )
    assert out.vs.tolist()[0] == pytest.approx([3.565, 2.85])
    assert out.advantages.tolist()[0] == pytest.approx([3.065, 1.85])
    assert out.rhos.tolist()[0] == pytest.approx([1.0, 0.5])
    assert out.cs.tolist()[0] == pytest.approx([1.0, 0.5])


@pytest.mark.parametrize("lam", [0.0, 0.6, 1.0])
def test_vtrace_on_policy_unclipped_is_td_lambda(lam):
    rows, inputs = random_batch(6, 9, 4, on_policy=True)
    out = vtrace(**inputs, gamma=0.95, lam=lam, rho_bar=math.inf, c_bar=math.inf)
    expected = [reference_td_lambda(r["rewards"], r["values"], r["bootstrap"], r["dones"], 0.95, lam) for r in rows]
    assert_rows(out.vs, expected, 9)


def test_vtrace_on_policy_lam_one_zero_values_is_monte_carlo_return():
    _, inputs = random_batch(6, 9, 5, on_policy=True)
    inputs["values"] = torch.zeros_like(inputs["values"])
    inputs["bootstrap_value"] = torch.zeros_like(inputs["bootstrap_value"])
    out = vtrace(**inputs, gamma=0.9, lam=1.0, rho_bar=math.inf, c_bar=math.inf)
    returns = discounted_returns(inputs["rewards"], inputs["dones"], 0.9, inputs["mask"])
    torch.testing.assert_close(out.vs, returns)
    torch.testing.assert_close(out.advantages, returns)


def test_vtrace_outputs_are_detached():
    _, inputs = random_batch(2, 3, 6)
    inputs["logp_target"] = inputs["logp_target"].nan_to_num().requires_grad_()
    inputs["values"] = inputs["values"].nan_to_num().requires_grad_()
    out = vtrace(**inputs)
    assert not any(t.requires_grad for t in (out.vs, out.advantages, out.rhos, out.cs))


def test_vtrace_rejects_left_padding():
    _, inputs = random_batch(2, 3, 7)
    inputs["mask"] = torch.tensor([[False, True, True], [True, True, True]])
    with pytest.raises(ValueError, match="right-padded"):
        vtrace(**inputs)


def test_discounted_returns_hand_example():
    # Row 0: episode ends at t=1, a new one runs t=2..3: [1 + .5*2, 2, 3 + .5*4, 4] = [2, 2, 5, 4].
    # Row 1: two valid steps then padding: [1 + .5*1, 1, 0, 0].
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, NAN, NAN]])
    dones = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    returns = discounted_returns(rewards, dones, 0.5, mask)
    assert returns.tolist() == [[2.0, 2.0, 5.0, 4.0], [1.5, 1.0, 0.0, 0.0]]


# --- AWR ---------------------------------------------------------------------------------------------------


def test_awr_weights_hand_example_with_clipping_and_padding():
    # temperature 2, clip ln4, last entry padding: exponents [0, ln2, ln4, 5 -> ln4, NaN -> ln4]
    # -> raw [1, 2, 4, 4, 4], sum 15, N = 5 -> weights 5/15 * raw.
    adv = torch.tensor([0.0, 2 * math.log(2), 2 * math.log(4), 10.0, NAN, 3.0])
    mask = torch.tensor([1, 1, 1, 1, 1, 0])
    weights = awr_weights(adv, temperature=2.0, clip=math.log(4), mask=mask)
    assert weights.tolist() == pytest.approx([1 / 3, 2 / 3, 4 / 3, 4 / 3, 4 / 3, 0.0])
    assert weights.sum().item() == pytest.approx(5.0)

    # the first four alone, no mask: raw [1, 2, 4, 4], sum 11, N = 4 -> weights 4/11 * raw.
    weights = awr_weights(adv[:4], temperature=2.0, clip=math.log(4))
    assert weights.tolist() == pytest.approx([4 / 11, 8 / 11, 16 / 11, 16 / 11])


def test_awr_weights_default_clip_bounds_the_ratio_and_mean_is_one():
    weights = awr_weights(torch.tensor([[0.0, 100.0], [-math.inf, 1.0]]), temperature=1.0)
    assert weights.mean().item() == pytest.approx(1.0)
    assert weights[0, 1] / weights[0, 0] == pytest.approx(math.exp(8.0))
    assert weights[1, 0].item() == 0.0


def test_awr_weights_detached_and_zero_when_nothing_valid():
    adv = torch.randn(3, requires_grad=True)
    assert not awr_weights(adv, 1.0).requires_grad
    assert awr_weights(adv, 1.0, mask=torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]


def test_weighted_nll_loss_is_masked_mean():
    logp = torch.tensor([-1.0, -2.0, NAN], requires_grad=True)
    loss = weighted_nll_loss(logp, torch.tensor([2.0, 0.5, 1.0]), torch.tensor([1, 1, 0]))
    assert loss.item() == pytest.approx((2.0 * 1.0 + 0.5 * 2.0) / 2)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1.0, -0.25, 0.0])


# --- KL ----------------------------------------------------------------------------------------------------


def test_approx_kl_zero_for_identical_and_positive_otherwise():
    logp = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    assert approx_kl(logp, logp).item() == 0.0
    assert approx_kl(logp + torch.tensor([0.1, -0.2, 0.3]), logp).item() > 0


def test_approx_kl_is_exact_kl_on_samples_in_proportion():
    # Samples drawn from old = [1/2, 1/4, 1/4] in exact proportion; the k3 mean is then KL(old || new) exactly.
    old, new = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.2, 0.3, 0.5])
    samples = torch.tensor([0, 0, 1, 2])
    estimate = approx_kl(new.log()[samples], old.log()[samples])
    assert estimate.item() == pytest.approx((old * (old / new).log()).sum().item(), rel=1e-6)


def test_approx_kl_ignores_padding():
    logp_new = torch.tensor([[-1.0, NAN], [-0.5, -0.2]])
    logp_old = torch.tensor([[-1.0, NAN], [-0.5, -0.7]])
    r = math.exp(0.5)
    assert approx_kl(logp_new, logp_old, torch.tensor([[1, 0], [1, 1]])).item() == pytest.approx((r - 1 - 0.5) / 3)


def strictly_monotone(values, increasing):
    """True when each value is strictly above (or below) the one before."""
    return all((b > a) if increasing else (b < a) for a, b in itertools.pairwise(values))


def test_kl_controller_rises_above_target_and_falls_below():
    ctl = KLController()
    assert ctl.coef == pytest.approx(0.1)
    assert strictly_monotone([ctl.coef] + [ctl.update(0.5, target=0.1) for _ in range(20)], increasing=True)
    ctl = KLController()
    assert strictly_monotone([ctl.coef] + [ctl.update(torch.tensor(0.01), target=0.1) for _ in range(20)], False)


def test_kl_controller_turns_around_when_kl_crosses_the_target():
    ctl = KLController()
    peak = max(ctl.update(0.5, target=0.1) for _ in range(20))
    falling = [ctl.update(0.01, target=0.1) for _ in range(40)]  # Adam's momentum carries it up for a few steps
    assert falling[-1] < peak
    assert strictly_monotone(falling[-20:], increasing=False)


def test_kl_controller_stays_in_bounds_and_non_finite_goes_to_max():
    ctl = KLController(init_coef=0.1, min_coef=0.09, max_coef=0.11, lr=0.05)
    assert max(ctl.update(10.0, target=0.0) for _ in range(50)) == pytest.approx(0.11)
    assert ctl.coef == pytest.approx(0.11)
    assert min(ctl.update(0.0, target=10.0) for _ in range(100)) == pytest.approx(0.09)
    assert ctl.coef == pytest.approx(0.09)
    assert ctl.update(math.nan, target=0.1) == pytest.approx(0.11)
    assert ctl.update(torch.tensor(math.inf), target=0.1) == pytest.approx(0.11)


def test_kl_controller_state_dict_round_trip_includes_optimizer():
    ctl = KLController()
    for kl in [0.5, 0.4, 0.3]:
        ctl.update(kl, target=0.1)
    restored = KLController()
    restored.load_state_dict(ctl.state_dict())
    assert restored.coef == ctl.coef
    assert restored.update(0.2, target=0.1) == ctl.update(0.2, target=0.1)


# --- normalisation -----------------------------------------------------------------------------------------


def test_masked_mean_and_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, NAN, NAN, NAN]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.5)
    assert masked_mean(x, mask, dim=1).tolist() == pytest.approx([2.0, 4.0])
    assert masked_mean(x[:1, :3]).item() == pytest.approx(2.0)
    # valid [1, 2, 3, 4]: mean 2.5, population var 1.25
    s = math.sqrt(1.25)
    expected = [[-1.5 / s, -0.5 / s, 0.5 / s, 0.0], [1.5 / s, 0.0, 0.0, 0.0]]
    assert masked_whiten(x, mask).tolist() == [pytest.approx(row, rel=1e-6) for row in expected]


def test_running_mean_std_exact():
    rms = RunningMeanStd()
    assert rms.normalize(torch.tensor([3.0])).item() == pytest.approx(3.0)  # identity before any update
    rms.update(torch.tensor([1.0, 2.0, 3.0, 4.0, NAN]), mask=torch.tensor([1, 1, 1, 1, 0]))
    assert (rms.mean.item(), rms.var.item()) == pytest.approx((2.5, 1.25))
    rms.update(torch.tensor([5.0]))  # now 1..5: mean 3, population var 2
    assert (rms.mean.item(), rms.var.item(), rms.count.item()) == pytest.approx((3.0, 2.0, 5.0))
    assert rms.normalize(torch.tensor([5.0, 1000.0, -1000.0])).tolist() == pytest.approx([2 / math.sqrt(2), 10, -10])


def test_running_mean_std_ema_and_state_dict():
    rms = RunningMeanStd(momentum=0.5)
    rms.update(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # first batch sets the statistics: 2.5, 1.25
    rms.update(torch.tensor([5.0]))  # mean .5*2.5 + .5*5 = 3.75; var .5*1.25 + .5*0 + .25*2.5**2 = 2.1875
    assert (rms.mean.item(), rms.var.item()) == pytest.approx((3.75, 2.1875))
    restored = RunningMeanStd(momentum=0.5)
    restored.load_state_dict(rms.state_dict())
    x = torch.tensor([0.0, 4.0])
    assert torch.equal(restored.normalize(x), rms.normalize(x))
