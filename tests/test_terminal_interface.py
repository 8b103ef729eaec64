"""`python -m unstable.terminal_interface`: attaches to the latest run under ./runs (or a given one) and shows its
numbers and rating ladder, read from the run's metrics.jsonl."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from unstable.pool import ModelPool
from unstable.records import GameRecord
from unstable.tracking import Tracker, keys

pytestmark = pytest.mark.slow  # runs the terminal program


def _recorded_run(run_dir) -> None:
    pool = ModelPool()
    pool.add_checkpoint(path=None, iteration=-1)
    pool.record_game(GameRecord("E", 0, {0: "ckpt--1", 1: "random"}, (), {0: 1.0, 1: -1.0}))
    tracker = Tracker(run_dir)
    tracker.add_source(pool)
    tracker.log({keys.STEP: 0})
    tracker.log({keys.STEP: 1, keys.LOSS: -0.125, keys.MEAN_REWARD: 0.5})


def test_the_terminal_interface_shows_the_latest_run(tmp_path):
    _recorded_run(tmp_path / "runs" / "older")
    _recorded_run(tmp_path / "runs" / "newest")
    result = subprocess.run(
        [sys.executable, "-m", "unstable.terminal_interface", "--once"],
        cwd=tmp_path,
        env=os.environ | {"COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "newest" in result.stdout and "-0.1250" in result.stdout and "+0.500" in result.stdout
    assert "ckpt--1" in result.stdout  # the rating ladder


def test_the_terminal_interface_says_when_there_is_no_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "unstable.terminal_interface", "--once"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "no run with a metrics.jsonl" in result.stderr
