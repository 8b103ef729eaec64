"""Balance between collection and learning: how long the learner waited for data and how long pacing held
collection back waiting for the learner, per learner step, and the run's recommendation from both."""

from __future__ import annotations

import json

import pytest

from unstable.collector.pacing import HeldSlots
from unstable.report.write import summary_markdown
from unstable.tracking import keys
from unstable.tracking.balance import (
    HELD_BACK_LIMIT,
    LEARNER_WAIT_LIMIT,
    balance_lines,
    recommendation,
    run_balance,
)


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_held_slots_integrate_the_empty_slots_over_time():
    clock = _Clock()
    held = HeldSlots(clock)
    held.set(slots=8, held=0)
    clock.now = 10.0  # 80 slot-seconds, none held
    held.set(slots=8, held=6)
    clock.now = 15.0  # 40 slot-seconds, 30 held
    assert held.take() == (30.0, 120.0)
    clock.now = 20.0  # a new window: still 6 of 8 held
    assert held.take() == (30.0, 40.0)
    held.set(slots=0, held=0)  # collection stopped: no slot time accrues
    clock.now = 100.0
    assert held.take() == (0.0, 0.0)


def _row(step: int, seconds: float, wait: float, held_share: float) -> dict:
    return {
        keys.STEP: step,
        keys.STEP_SECONDS: seconds,
        keys.WAIT_SECONDS: wait,
        keys.WAIT_SHARE: wait / seconds,
        keys.HELD_BACK_SHARE: held_share,
    }


def test_the_run_balance_weighs_each_step_by_its_wall_time_and_leaves_out_the_first():
    rows = [{keys.STEP: 0}, _row(1, 100.0, 99.0, 0.0), _row(2, 10.0, 5.0, 0.2), _row(3, 30.0, 3.0, 0.6), {"final": 1}]
    balance = run_balance(rows)
    assert balance.learner_wait_share == pytest.approx(8.0 / 40.0)
    assert balance.held_back_share == pytest.approx((0.2 * 10 + 0.6 * 30) / 40.0)
    assert run_balance(rows[:2]) is None  # only the first step: its wait is the start-up's
    assert run_balance(json.loads(json.dumps(rows[:1]))) is None


@pytest.mark.parametrize(
    ("wait", "held", "advice"),
    [
        (0.62, 0.0, "collection is the bottleneck: add inference actors (inference.num_actors)"),
        (0.05, 0.40, "collection was held back waiting for the learner: add learners (learner.num_learners)"),
        (0.50, 0.50, "both sides waited for each other"),
        (0.10, 0.10, "balanced"),
    ],
)
def test_the_recommendation_names_the_side_that_waits(wait, held, advice):
    from unstable.tracking.balance import Balance

    assert advice in recommendation(Balance(wait, held))


def test_the_limits_are_shares_of_time():
    assert 0 < LEARNER_WAIT_LIMIT < 1 and 0 < HELD_BACK_LIMIT < 1


def test_balance_lines_state_both_shares_then_the_advice():
    rows = [_row(1, 50.0, 50.0, 0.0), _row(2, 10.0, 6.2, 0.0), _row(3, 10.0, 6.2, 0.0)]
    first, advice = balance_lines(rows)
    assert first == (
        "balance over learner steps 2-3: the learner waited for data 62% of the time; "
        "collection was held back waiting for the learner 0% of its game slots' time"
    )
    assert advice.startswith("recommendation: collection is the bottleneck")
    assert balance_lines(rows[:1]) == ["balance: too few learner steps to judge (the first includes the start-up)"]


def test_the_report_states_the_balance():
    rows = [_row(1, 50.0, 50.0, 0.0), _row(2, 10.0, 1.0, 0.5), _row(3, 10.0, 1.0, 0.5)]
    markdown = summary_markdown("run", rows, [])
    for line in balance_lines(rows):
        assert f"- {line}" in markdown


def test_steps_dropped_unused_say_collection_outran_the_learner():
    """Without pacing, collection that outruns the learner is never held back: the StepBuffer drops the steps the
    learner had no time for. Their share since the first learner step (the counters are totals) tells it."""
    from unstable.tracking.balance import DROPPED_LIMIT, Balance

    first, last = _row(1, 10.0, 0.0, 0.0), _row(2, 10.0, 0.0, 0.0)
    first |= {keys.BUFFER_STEPS_ADDED: 100, keys.BUFFER_STEPS_DROPPED: 0}
    last |= {keys.BUFFER_STEPS_ADDED: 500, keys.BUFFER_STEPS_DROPPED: 280}
    balance = run_balance([{keys.STEP: 0}, first, last])
    assert balance.dropped_share == pytest.approx(280 / 400) and balance.dropped_share > DROPPED_LIMIT
    assert "collection outran the learner: 70% of the steps it generated were dropped" in recommendation(balance)
    assert recommendation(Balance(0.1, 0.0, 0.1)).startswith("balanced")
