"""Bounded cost per step: resume states at an interval, written off the learner's path, only the newest kept;
checkpoints a kept state needs survive retention; metrics rows that keep one size however many checkpoints the
pool rates; the dashboard and the report reading the tables from their own files."""

import json
import os
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from unstable.algorithms import Reinforce
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.dashboard import panels
from unstable.learner import Learner, LearnerConfig, LoraConfig
from unstable.learner.config import ResumeStateConfig, RetentionConfig
from unstable.pool import ModelPool
from unstable.records import GameRecord, Step
from unstable.report import data
from unstable.runtime import resume
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, TrackerConfig, keys
from unstable.tracking.history import LATEST_TABLES_FILE, TABLES_FILE, RowFollower, latest_value, read_rows

from .runs import EXAMPLE, tiny_run
from .zygote import Finished, Forked, start_python


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
        num_steps=num_steps, batch_size=2, optimizer={"learning_rate": 0.01},
        policy={"micro_batch_tokens": 64, "lora": LoraConfig(lora_rank=2)},
        resume_state=ResumeStateConfig(every_steps=5, every_minutes=None, keep_last=2),
        retention=RetentionConfig(keep_last=2),
    )  # fmt: skip
    buffer = StepBuffer(BufferConfig(max_buffer_size=64))
    for seed in range(num_steps):
        buffer.add_game(_game(seed, {0: "ckpt-0", 1: "random"}))
    pool = ModelPool()
    pool.add_checkpoint(None, iteration=-1)
    tracker = Tracker(run_dir, cfg=TrackerConfig(tensorboard=False, wandb="disabled"))
    return LearnerLoop(Learner.build(model_dir, Reinforce(), cfg), buffer, pool, tracker, str(run_dir))


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


def test_retention_keeps_the_checkpoint_a_game_in_flight_plays(tiny_model_dir, tmp_path, one_torch_thread):
    """A game that started on step 1's checkpoint and outlives retention's last 2 steps keeps its folder (it was
    deleted, and the adapter's reload failed); released, the next prune lets it go."""
    loop = _loop(tiny_model_dir, tmp_path, num_steps=6)
    loop.train(1)
    loop.model_pool.hold([1])
    loop.train(4)
    loop.save_state()
    loop.writer.wait()
    assert resume.saved_steps(tmp_path / "checkpoints", "ckpt-") == [1, 3, 4, 5]
    loop.model_pool.release([1])
    loop.train(1)
    loop.close()
    assert 1 not in resume.saved_steps(tmp_path / "checkpoints", "ckpt-")


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


def _pool_with(checkpoints: int) -> ModelPool:
    pool = ModelPool()
    for k in range(checkpoints):
        pool.add_checkpoint(f"/ckpt-{k}", iteration=k)
        for seed in range(3):
            pool.record_game(_game(seed, {0: f"ckpt-{k}", 1: "random"}))
    return pool


def test_metrics_rows_keep_one_size_however_many_checkpoints_the_pool_rates(tmp_path):
    sizes = {}
    for checkpoints in (3, 60):
        tracker = Tracker(tmp_path / str(checkpoints))  # tables_every 10, the default
        tracker.add_source(_pool_with(checkpoints))
        for step in range(1, 21):
            tracker.log({keys.STEP: step})
        sizes[checkpoints] = len((tracker.path).read_text().splitlines()[-1])
    assert abs(sizes[60] - sizes[3]) < 20, sizes  # digits of the counts may differ, nothing else

    tables = [json.loads(line) for line in (tmp_path / "60" / TABLES_FILE).read_text().splitlines()]
    assert [t[keys.STEP] for t in tables] == [10, 20]
    assert len(tables[-1][keys.POOL_LADDER]) == 1 + 3 + 20  # random, the 3 active and 20 retired (the defaults)
    latest = json.loads((tmp_path / "60" / LATEST_TABLES_FILE).read_text())
    assert latest[keys.STEP] == 20 and "ckpt-59" in latest[keys.POOL_MATCH_MATRIX]

    rows = read_rows(tmp_path / "60")  # reading back puts each table into the row of its step
    assert [row[keys.STEP] for row in rows if keys.POOL_LADDER in row] == [10, 20]
    assert latest_value(rows, keys.POOL_LADDER) == latest[keys.POOL_LADDER]


def test_a_follower_meets_tables_written_before_their_row_and_the_newest_at_every_poll(tmp_path):
    tracker = Tracker(tmp_path, cfg=TrackerConfig(tables_every=10))
    tracker.add_source(_pool_with(2))
    tracker.log({keys.STEP: 0})
    follower = RowFollower(tmp_path)
    assert keys.POOL_LADDER in follower.poll()[0]  # step 0: in tables.jsonl
    tracker.log({keys.STEP: 1})
    assert keys.POOL_LADDER in follower.poll()[0]  # step 1: only the newest, tables.json
    tracker.log({keys.STEP: 2})
    tracker.log({keys.STEP: 3})
    assert [keys.POOL_LADDER in row for row in follower.poll()] == [False, True]


def test_dashboard_and_report_show_the_ladder_from_the_tables_files(tmp_path):
    tracker = Tracker(tmp_path, cfg=TrackerConfig(tables_every=5))
    tracker.add_source(_pool_with(12))
    for step in range(11):
        tracker.log({keys.STEP: step})
    rows = read_rows(tmp_path)
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not any(keys.POOL_LADDER in row for row in written)
    console = Console(width=100, record=True, file=open(os.devnull, "w"))
    console.print(panels.ladder(rows))
    assert "ckpt-11" in console.export_text()
    assert data.checkpoint_ratings(rows)["steps"] == list(range(12))
    assert data.match_matrix(rows)["agents"][-1] == "random"


def _train(args: list[str], ray_address: str | None = None) -> tuple[Finished, int | None]:
    """`unstable train args` in a process of its own (joining the test's Ray), and with `ray_address` the most threads
    the run's inference actor held while it went on."""
    run = start_python(["-m", "unstable.cli.main", "train", *args], cwd=Path.cwd(), env=dict(os.environ))
    threads = _most_inference_threads(run, ray_address) if ray_address else None
    out, err = (stream.decode() for stream in run.communicate(timeout=600))
    return Finished(run.returncode, out, err), threads


def _most_inference_threads(run: Forked, ray_address: str) -> int:
    """The most threads the live inference actor on the Ray at `ray_address` held while `run` went on (the run's own:
    the actors of the test process's earlier runs are dead)."""
    import psutil
    import ray
    from ray._private import state

    ray.init(address=ray_address)
    threads = 0
    try:
        while run.poll() is None:
            for actor in state.actors().values():
                if actor["ActorClassName"] == "InferenceServerActor" and actor["State"] == "ALIVE":
                    try:
                        threads = max(threads, psutil.Process(actor["Pid"]).num_threads())
                    except psutil.NoSuchProcess:
                        pass
            time.sleep(0.5)
    finally:
        ray.shutdown()
    return threads


@pytest.mark.slow
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_unstable_train_saves_every_5_steps_keeps_2_resumes_and_stays_within_its_bounds(
    tiny_model_dir, tmp_path, shared_ray
):
    """Resume states every 5 steps, the newest 2 kept, and a resume from the state before the newest. Besides:
    every game against the anchor, one active checkpoint and `pool.max_retired=1`: however many checkpoints the run
    makes, the newest tables hold the anchor, the newest checkpoint and one retired one, and the row still counts every
    checkpoint registered (the base model and one per step). Ray gives a threaded actor `max_concurrency` threads, and
    over a long run each one is used and its stack touched (the soak's inference actor grew by ~0.1 MB per learner
    step with 4,096 of them): on the YAML path it gets one per game in flight and a few for control calls."""
    overrides = tiny_run(
        tmp_path, tiny_model_dir, "bounded", "warm_start=null", "learner.num_steps=12",
        "learner.resume_state.every_steps=5", "learner.resume_state.keep_last=2", "learner.retention.keep_last=2",
        "tracker.tables_every=5", "pool.sample_mode=fixed", "pool.max_active_lora=1", "pool.max_retired=1",
    )  # fmt: skip
    done, threads = _train([str(EXAMPLE), *[arg for o in overrides for arg in ("--set", o)]], ray_address=shared_ray)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 0 < threads < 200, threads
    run_dir = tmp_path / "bounded"
    assert resume.saved_steps(run_dir / "state", "step-") == [10, 12]
    assert len(resume.saved_steps(run_dir / "checkpoints", "ckpt-")) <= 5

    # a kill after step 12's state but before the end: the rows of 11 and 12 are redone from state 10
    (run_dir / "state" / "latest.json").write_text('{"step": 10}')
    (run_dir / "state" / "step-12").rename(run_dir / "state" / "step-12.tmp")
    again, _ = _train(["--resume", str(run_dir), "--set", "learner.num_steps=13"])
    assert again.returncode == 0, again.stderr[-3000:]
    rows = read_rows(run_dir)
    assert [row[keys.STEP] for row in rows if keys.STEP in row] == list(range(14))  # each step once
    tables = [json.loads(line)[keys.STEP] for line in (run_dir / TABLES_FILE).read_text().splitlines()]
    assert tables == [0, 5, 10]
    assert resume.saved_steps(run_dir / "state", "step-") == [10, 13]  # step-12.tmp went with the redo
    assert latest_value(rows, keys.POOL_LADDER)  # the final row's tables
    latest = json.loads((run_dir / LATEST_TABLES_FILE).read_text())  # the run's end, after its last row
    assert len(latest[keys.POOL_LADDER]) <= 3 and len(latest[keys.POOL_MATCH_MATRIX]) <= 3, latest
    assert rows[-1][keys.POOL_CHECKPOINTS] == 14


def test_no_actor_shell_makes_ray_keep_a_record_of_each_call():
    """Ray's GCS keeps ~3.5 KB per traced actor call, up to 100,000 calls: hundreds of MB and growing for the first
    days of a run (measured: +1.8 MB per learner step in the soak). The shells are untraced."""
    import ray

    from unstable.runtime import actors, learner_actors

    modules = (actors, learner_actors)
    shells = {obj for module in modules for obj in vars(module).values() if isinstance(obj, ray.actor.ActorClass)}
    assert len(shells) == 8
    assert [s for s in shells if s._default_options.get("enable_task_events") is not False] == []
