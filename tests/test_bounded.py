"""Bounded cost per step: resume states at an interval, written off the learner's path, only the newest kept;
checkpoints a kept state needs survive retention."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from unstable.algorithms import Reinforce
from unstable.buffer import StepBuffer
from unstable.learner import Learner, LearnerConfig, LoraConfig, PolicyModel
from unstable.learner.config import ResumeStateConfig, RetentionConfig
from unstable.pool import ModelPool
from unstable.records import GameRecord, Step
from unstable.rewards import WinDrawLossFormatter
from unstable.runtime import resume
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, TrackerConfig, keys
from unstable.tracking.history import read_rows

from .runs import EXAMPLE, tiny_run

SRC = Path(__file__).resolve().parents[1] / "src"


def _game(seed: int, players: dict[int, str]) -> GameRecord:
    """A two-seat game of made-up tokens, seat 0 the learner, won by the seat `seed` picks."""
    steps = tuple(
        Step("TicTacToe-v0-train", turn % 2, turn, "o", "[1]", prompt_token_ids=(5, 6, 7),
             completion_token_ids=(8 + turn, 9), behaviour_logprobs=(-1.0, -1.0))
        for turn in range(4)
    )  # fmt: skip
    rewards = {0: 1.0, 1: -1.0} if seed % 2 else {0: -1.0, 1: 1.0}
    return GameRecord("TicTacToe-v0-train", seed, players, steps, rewards, learner_player_ids=(0,))


def _loop(model_dir: str, run_dir: Path, num_steps: int) -> LearnerLoop:
    """A learner loop over plain components, saving its state every 5 steps and keeping 2, checkpoints of the
    last 2 steps kept by retention; its buffer holds 2 steps per update."""
    cfg = LearnerConfig(
        num_steps=num_steps, batch_size=2, micro_batch_tokens=64, learning_rate=0.01, lora=LoraConfig(lora_rank=2),
        resume_state=ResumeStateConfig(every_steps=5, every_minutes=None, keep_last=2),
        retention=RetentionConfig(keep_last=2),
    )  # fmt: skip
    buffer = StepBuffer(64, final_reward_transformation=WinDrawLossFormatter())
    for seed in range(num_steps):
        buffer.add_game(_game(seed, {0: "ckpt-0", 1: "random"}))
    pool = ModelPool()
    pool.add_checkpoint(None, iteration=-1)
    tracker = Tracker(run_dir, cfg=TrackerConfig(tensorboard=False, wandb="disabled"))
    return LearnerLoop(Learner(PolicyModel(model_dir, cfg), Reinforce(), cfg), buffer, pool, tracker, str(run_dir))


def test_states_every_5_steps_keep_the_newest_2_and_the_checkpoints_their_pools_play(
    tiny_model_dir, tmp_path, one_torch_thread
):
    loop = _loop(tiny_model_dir, tmp_path, num_steps=12)
    loop.train(12)
    loop.close()
    assert resume.saved_steps(tmp_path / "state", "step-") == [10, 12]  # 5 went; 12 is the run's last step
    referenced = {10: [8, 9, 10], 12: [10, 11, 12]}  # each state's pool plays its newest max_active_lora=3
    for step, versions in referenced.items():
        assert json.loads((tmp_path / "state" / f"step-{step}" / resume.REFERENCED).read_text()) == versions
    assert resume.saved_steps(tmp_path / "checkpoints", "ckpt-") == [8, 9, 10, 11, 12]  # retention alone: 11, 12
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row[keys.STEP] for row in rows] == list(range(1, 13))
    saved_on_path = [row[keys.STATE_SAVE_SECONDS] > 0 for row in rows]
    assert saved_on_path == [step in (6, 11) for step in range(1, 13)]  # the snapshot of the step before

    resumed = _loop(tiny_model_dir, tmp_path, num_steps=13)
    assert resumed.restore(str(resume.latest_state(tmp_path)[1])) == 12
    assert [c.version for c in resumed.model_pool.active_checkpoints()] == [10, 11, 12]
    assert resumed.train(1)[0][keys.STEP] == 13
    resumed.close()
    assert resume.saved_steps(tmp_path / "state", "step-") == [12, 13]
    assert resume.saved_steps(tmp_path / "checkpoints", "ckpt-") == [10, 11, 12, 13]


def test_the_state_is_written_off_the_learners_path_one_write_at_a_time(tmp_path, monkeypatch):
    release, writing = threading.Event(), threading.Event()
    write = resume.write_snapshot

    def slow(*args):
        writing.set()
        release.wait(10)
        return write(*args)

    monkeypatch.setattr(resume, "write_snapshot", slow)
    writer = resume.StateWriter(tmp_path)
    parts = {name: {"x": 1} for name in resume.PARTS}
    writer.submit(1, resume.snapshot(parts), [1])
    assert writing.wait(10) and resume.latest_state(tmp_path) is None  # submit returned while the write waits
    second = threading.Thread(target=writer.submit, args=(2, resume.snapshot(parts), [2]))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # the second write waits for the first
    release.set()
    second.join(10)
    writer.wait()
    assert resume.latest_state(tmp_path)[0] == 2 and (tmp_path / "state" / "step-1").exists()


def test_a_failed_state_write_stops_the_learner_at_its_next_save(tmp_path):
    (tmp_path / "state").write_text("a file where the state directory goes")
    writer = resume.StateWriter(tmp_path)
    writer.submit(1, resume.snapshot({"learner": {}}), [])
    with pytest.raises(RuntimeError, match="writing the resume state under .*state failed"):
        writer.wait()


def _train(args: list[str]) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "unstable.cli.main", "train", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_unstable_train_saves_every_5_steps_keeps_2_and_resumes(tiny_model_dir, tmp_path):
    overrides = tiny_run(
        tmp_path, tiny_model_dir, "bounded", "warm_start=null", "learner.num_steps=12",
        "learner.resume_state.every_steps=5", "learner.resume_state.keep_last=2", "learner.retention.keep_last=2",
        
    )  # fmt: skip
    done = _train([str(EXAMPLE), *[arg for o in overrides for arg in ("--set", o)]])
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "bounded"
    assert resume.saved_steps(run_dir / "state", "step-") == [10, 12]
    assert len(resume.saved_steps(run_dir / "checkpoints", "ckpt-")) <= 5

    # a kill after step 12's state but before the end: the rows of 11 and 12 are redone from state 10
    (run_dir / "state" / "latest.json").write_text('{"step": 10}')
    (run_dir / "state" / "step-12").rename(run_dir / "state" / "step-12.tmp")
    again = _train(["--resume", str(run_dir), "--set", "learner.num_steps=13"])
    assert again.returncode == 0, again.stderr[-3000:]
    rows = read_rows(run_dir)
    assert [row[keys.STEP] for row in rows if keys.STEP in row] == list(range(14))  # each step once
    assert resume.saved_steps(run_dir / "state", "step-") == [10, 13]  # step-12.tmp went with the redo
