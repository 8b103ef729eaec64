"""The line `unstable train` prints per learner step shows what is learning: the training win rate against each
opponent over the tracker's rolling window, not a frozen evaluation."""

import re

import pytest

from unstable.cli.main import main

from .runs import EXAMPLE, tiny_run


@pytest.mark.slow
def test_the_progress_line_shows_the_training_win_rate_per_opponent(tiny_model_dir, tmp_path, capsys):
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "progress",
        "learner.num_steps=2",
        "warm_start=null",  # the random tiny model: what it learns does not matter here
        "pool.sample_mode=fixed",  # every training game against the random agent
    )
    assert main(["train", str(EXAMPLE), "--no-wandb", *(a for o in overrides for a in ("--set", o))]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    print("\n".join(lines))
    assert re.search(r"\| win vs random \d\.\d\d \(n=\d+\)$", lines[-1]), lines[-1]
    assert "eval" not in lines[-1]
