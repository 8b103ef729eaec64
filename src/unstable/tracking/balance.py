"""Balance between collection and learning over a run, from its rows: the share of the time the learner waited for
data and the share of collection's game-slot time that pacing held back waiting for the learner, and what to change.

Both are averaged over the run's learner steps after the first, each step weighted by its wall time
(`learner/step_seconds`): the first step's wait is mostly the start-up (engines loading, the first games), not
the balance of the two sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unstable.tracking import keys

# Above this share of its time waiting for data, the learner could train up to 1 / (1 - 0.25) = 1.33x as fast with
# faster collection: a third more updates is worth moving capacity for; below it the gain is within the run-to-run
# spread of a shared machine. A judgement, not a measurement.
LEARNER_WAIT_LIMIT = 0.25
# The same bound for collection: a quarter of the game slots held empty means collection could run 1.33x as fast
# with a learner that kept up.
HELD_BACK_LIMIT = 0.25
# Above this share of the steps collection generated dropped by the StepBuffer before any batch took them (its
# counters are totals), collection outran the learner without being held back (pacing off, or the buffer still
# filling): a quarter of the games' inference spent for nothing.
DROPPED_LIMIT = 0.25


@dataclass(frozen=True)
class Balance:
    """The run's shares of waiting, 0 to 1."""

    learner_wait_share: float  # of the learner's wall time, waiting for the StepBuffer to hold a batch
    held_back_share: float  # of collection's game-slot time, slots left empty by pacing (waiting for the learner)
    dropped_share: float = 0.0  # of the steps added to the StepBuffer, dropped before training


def run_balance(rows: list[dict[str, Any]]) -> Balance | None:
    """The balance over the learner rows of `rows` after the first (`keys.STEP_SECONDS` in them), None without
    such rows (a run of one step, or one logged before these keys existed)."""
    learner_rows = [row for row in rows if keys.STEP_SECONDS in row]
    timed = learner_rows[1:]
    seconds = sum(row[keys.STEP_SECONDS] for row in timed)
    if seconds <= 0:
        return None
    waited = sum(row[keys.WAIT_SECONDS] for row in timed)
    held = sum(row.get(keys.HELD_BACK_SHARE, 0.0) * row[keys.STEP_SECONDS] for row in timed)
    return Balance(waited / seconds, held / seconds, _dropped_share(learner_rows))


def _dropped_share(rows: list[dict[str, Any]]) -> float:
    """The share of the steps added to the StepBuffer after the first of `rows` up to the last that it dropped."""
    first, last = rows[0], rows[-1]
    added = last.get(keys.BUFFER_STEPS_ADDED, 0) - first.get(keys.BUFFER_STEPS_ADDED, 0)
    dropped = last.get(keys.BUFFER_STEPS_DROPPED, 0) - first.get(keys.BUFFER_STEPS_DROPPED, 0)
    return dropped / added if added > 0 else 0.0


def recommendation(balance: Balance) -> str:
    """What to change, in one sentence, from which side waited more than its limit."""
    learner_waits = balance.learner_wait_share > LEARNER_WAIT_LIMIT
    collection_waits = balance.held_back_share > HELD_BACK_LIMIT
    if learner_waits and collection_waits:
        return (
            "both sides waited for each other: the StepBuffer holds too little beyond one batch for collection and "
            "learning to overlap; raise buffer.max_buffer_size (or lower learner.batch_size)"
        )
    if learner_waits:
        return (
            "collection is the bottleneck: add inference actors (inference.num_actors) or games in flight "
            "(collector.num_workers), or give inference a faster device"
        )
    if balance.dropped_share > DROPPED_LIMIT and not learner_waits:
        return (
            f"collection outran the learner: {balance.dropped_share:.0%} of the steps it generated were dropped "
            "before training; turn on collector.pacing (it holds games back instead) or add learners "
            "(learner.num_learners)"
        )
    if collection_waits:
        return (
            "collection was held back waiting for the learner: add learners (learner.num_learners) or give the "
            "learner a faster device"
        )
    return (
        f"balanced (neither side waited more than {LEARNER_WAIT_LIMIT:.0%} of its time): "
        "grow both sides together to go faster"
    )


def balance_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Two lines for the end of a run and its report: both shares over the run, then the recommendation (one line
    when the run has too few learner steps to judge)."""
    balance = run_balance(rows)
    if balance is None:
        return ["balance: too few learner steps to judge (the first includes the start-up)"]
    steps = [row[keys.STEP] for row in rows if keys.STEP_SECONDS in row][1:]
    return [
        f"balance over learner steps {steps[0]}-{steps[-1]}: the learner waited for data "
        f"{balance.learner_wait_share:.0%} of the time; collection was held back waiting for the learner "
        f"{balance.held_back_share:.0%} of its game slots' time",
        f"recommendation: {recommendation(balance)}",
    ]
