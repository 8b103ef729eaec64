"""Wilson intervals, win/draw/loss tallies and their JSON-ready summary."""

from __future__ import annotations

import json
import math

import pytest

from unstable.tracking.stats import WDL, mean_interval, wdl_summary, wilson_interval


def test_wilson_hand_computed_case():
    # p = 0.8, z^2 = 3.8416: centre = (0.8 + 0.19208) / 1.38416 = 0.71683,
    # half width = 1.96 * sqrt(0.016 + 0.009604) / 1.38416 = 0.22658  ->  (0.490, 0.943)
    low, high = wilson_interval(8, 10)
    assert round(low, 3) == 0.490 and round(high, 3) == 0.943


def test_wilson_edges_and_symmetry():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    low, high = wilson_interval(2, 10)
    assert low == pytest.approx(1 - wilson_interval(8, 10)[1]) and high == pytest.approx(1 - wilson_interval(8, 10)[0])
    assert wilson_interval(8, 10, z=2.58)[0] < wilson_interval(8, 10)[0]
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_wdl_rates_and_intervals():
    wdl = WDL.from_outcomes(["win"] * 8 + ["draw"] + ["loss"])
    assert (wdl.wins, wdl.draws, wdl.losses, wdl.n) == (8, 1, 1, 10)
    assert (wdl.win_rate, wdl.draw_rate, wdl.loss_rate) == (0.8, 0.1, 0.1)
    assert wdl.win_interval() == wilson_interval(8, 10)
    assert wdl.loss_interval() == wdl.draw_interval() == wilson_interval(1, 10)
    assert WDL().win_rate == 0.0 and WDL().win_interval() == (0.0, 1.0)
    with pytest.raises(ValueError):
        WDL.from_outcomes(["victory"])


def test_wdl_summary_is_json_ready():
    summary = wdl_summary(iter(["win"] * 8 + ["draw"] + ["loss"]))
    assert summary == {
        "games": 10,
        "wins": 8,
        "draws": 1,
        "losses": 1,
        "win_rate": 0.8,
        "draw_rate": 0.1,
        "loss_rate": 0.1,
        "win_ci": list(wilson_interval(8, 10)),
        "draw_ci": list(wilson_interval(1, 10)),
        "loss_ci": list(wilson_interval(1, 10)),
    }
    assert json.loads(json.dumps(summary)) == summary
    empty = wdl_summary([])
    assert empty["games"] == 0 and empty["win_rate"] == 0.0 and empty["win_ci"] == [0.0, 1.0]
    with pytest.raises(ValueError, match="unknown outcomes"):
        wdl_summary(["win", None])


def test_mean_interval_uses_students_t_across_seeds():
    mean, low, high = mean_interval([0.1, 0.2, 0.3])
    half = 4.303 * 0.1 / math.sqrt(3)  # t_{0.975, 2} * sample std / sqrt(n)
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - half) and high == pytest.approx(0.2 + half)
    assert mean_interval([0.5])[1:] == (-math.inf, math.inf)
    with pytest.raises(ValueError):
        mean_interval([])
