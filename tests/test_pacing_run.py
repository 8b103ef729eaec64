"""Pacing through `unstable train`: a run whose learner is slower than its games trains on what they generate
instead of letting the StepBuffer drop most of it (issue 37: 72% of a demo's generated steps were dropped)."""

import json

import pytest

from unstable.cli.main import main
from unstable.tracking import keys

from .runs import EXAMPLE, tiny_run

pytestmark = pytest.mark.slow  # a run of unstable train


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_a_paced_run_drops_few_of_the_steps_it_generates(tiny_model_dir, tmp_path):
    # the demo's proportions cut down: 16 games in flight, a buffer of 2 batches, the learner slower than the games
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "paced",
        "learner.num_steps=4",
        "learner.batch_size=16",
        "buffer.max_buffer_size=32",
        "collector.num_workers=16",
        "warm_start=null",  # the random tiny model: what it learns does not matter here
        "collector.pacing=true",
    )
    assert main(["train", str(EXAMPLE), "--no-wandb", *(a for o in overrides for a in ("--set", o))]) == 0
    rows = [json.loads(line) for line in (tmp_path / "paced" / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    assert final[keys.BUFFER_STEPS_ADDED] >= 4 * 16
    assert final[keys.BUFFER_STEPS_DROPPED] < 0.1 * final[keys.BUFFER_STEPS_ADDED]
    assert final[keys.GAMES_HELD_BACK] > 0
