"""A run survives `kill -9`: killed in its warm start, mid-way through a state write and between a row and its
state, it resumes three times and ends with the warm start redone and used, every learner step logged once, its
checkpoints and ratings carried on, the restored weights equal to the saved ones bit for bit, and no game seed
played twice. Resumed once more it says it is finished and does nothing; with its warm start deleted it refuses."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from unstable.buffer import StepBuffer
from unstable.collector.collector import RECORDS_ENV
from unstable.config import load_config
from unstable.learner import Learner
from unstable.pool import ModelPool
from unstable.runtime import resume
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, keys

from .runs import EXAMPLE, ray_workers_since, tiny_run
from .zygote import Forked, start_python

pytestmark = pytest.mark.slow  # runs of unstable train


def _overrides(tmp_path, model_dir) -> list[str]:
    return tiny_run(
        tmp_path,
        model_dir,
        "killed",
        "learner.num_steps=4",
        "warm_start.games=8",  # a warm start of a few updates, to be killed in
        "warm_start.batch_size=8",
        "learner.policy.lora={lora_rank: 4, lora_alpha: 8}",  # adapter checkpoints, as the weight check reads them
        "learner.resume_state.every_steps=1",  # a state per step, so each kill has one just behind it
    )


def _start(args: list[str], pause_at: str | None, records_dir: Path, ray_address: str) -> Forked:
    """`unstable train args` in a session of its own joining the Ray at `ray_address`, as a run joins a cluster,
    paused at `pause_at` (`resume.PAUSE_ENV`) if given; its two streams as one."""
    env = os.environ | {"RAY_ADDRESS": ray_address, RECORDS_ENV: str(records_dir)}  # every session's training games
    env.pop(resume.PAUSE_ENV, None)
    if pause_at:
        env[resume.PAUSE_ENV] = pause_at
    command = ["-m", "unstable.cli.main", "train", *args]
    return start_python(command, cwd=Path.cwd(), env=env, new_session=True, merge_stderr=True)


def _kill_when_paused(process: Forked, run_dir: Path, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not (run_dir / resume.PAUSE_MARKER).exists():
        if process.poll() is not None:
            raise AssertionError(f"run ended before pausing:\n{process.communicate()[0].decode()[-3000:]}")
        assert time.time() < deadline, "the run never reached its pause point"
        time.sleep(0.5)
    _kill_run(process)
    (run_dir / resume.PAUSE_MARKER).unlink()


def _kill_run(process: Forked) -> None:
    """kill -9 of the whole run: its driver's session, then every Ray worker process started since (its actors) on
    the test process's Ray; Ray's own daemons live on, as a cluster's do."""
    started = psutil.Process(process.pid).create_time()
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.time() + 60
    while actors := ray_workers_since(started):
        for actor in actors:
            actor.kill()
        psutil.wait_procs(actors, timeout=5)
        assert time.time() < deadline, "the run's actors outlived kill -9"


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[keys.STEP] for r in rows if keys.STEP in r]


def _game_seeds(records_dir: Path) -> list[int]:
    """The seed of every training game the sessions wrote (a line torn by a kill is skipped)."""
    seeds = []
    for line in (records_dir / "records.jsonl").read_text().splitlines():
        try:
            seeds.append(json.loads(line)[0]["seed"])
        except json.JSONDecodeError:
            continue
    return seeds


def _latest_step(run_dir: Path) -> int:
    return json.loads((run_dir / "state" / "latest.json").read_text())["step"]


def _warm_start_checkpoint(run_dir: Path) -> str:
    """The LoRA warm start the run's `config.yaml` starts RL from: one in `run_dir/warm-start/`, saved whole."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    path = config["learner"]["policy"]["initial_lora_path"]  # relative to the run directory
    assert config["warm_start"] is None and path, "the run starts RL from no warm start"
    assert Path(path).parent.parent == Path("warm-start") and (run_dir / path / "adapter_model.safetensors").exists()
    return path


def _restored_adapter(cfg, model_dir: str, run_dir: Path) -> dict[str, torch.Tensor]:
    """The weights a learner holds after `LearnerLoop.restore` of the latest state, as the adapter file names them."""
    learner = Learner.build(model_dir, cfg.learner.algorithm.build(), cfg.learner)
    loop = LearnerLoop(
        learner,
        StepBuffer(cfg.buffer.model_copy(update={"max_buffer_size": 8})),
        ModelPool(cfg.pool),
        Tracker(run_dir / "x"),
        run_dir,
    )
    loop.restore(str(resume.latest_state(run_dir)[1]))
    return get_peft_model_state_dict(learner.policy.model)


@pytest.mark.long  # a minute or more of runs: scheduled first
def test_killed_three_times_the_run_resumes_losing_and_repeating_nothing(tiny_model_dir, tmp_path, _ray_head):
    overrides = _overrides(tmp_path, tiny_model_dir)
    sets = [arg for o in overrides for arg in ("--set", o)]
    run_dir = tmp_path / "killed"

    # kill 0: in the warm start, after the first of its two SFT passes
    _kill_when_paused(_start([str(EXAMPLE), *sets], "warm-start:1", tmp_path, _ray_head), run_dir)
    assert not (run_dir / "metrics.jsonl").exists()

    # kill 1: the warm start redone, step 2's state is written to its temporary directory but not yet renamed
    _kill_when_paused(_start(["--resume", str(run_dir)], "state-write:2", tmp_path, _ray_head), run_dir)
    warm = _warm_start_checkpoint(run_dir)
    assert _latest_step(run_dir) == 1 and (run_dir / "state" / "step-2.tmp").exists()
    # row 2 was written, its state not; the write is off the learner's path, so row 3 may follow before the kill
    assert _steps(run_dir)[:3] == [0, 1, 2]

    # kill 2: step 3's row is written, its state not yet
    _kill_when_paused(_start(["--resume", str(run_dir)], "after-log:3", tmp_path, _ray_head), run_dir)
    assert _latest_step(run_dir) == 2 and _steps(run_dir) == [0, 1, 2, 3]
    cfg = load_config(EXAMPLE, overrides)
    saved = load_file(run_dir / "checkpoints" / "ckpt-2" / "adapter_model.safetensors")
    restored = _restored_adapter(cfg, tiny_model_dir, run_dir)
    assert saved.keys() == restored.keys()
    assert all(torch.equal(saved[k], restored[k]) for k in saved)  # bit for bit
    pool_at_2 = resume.load_part(run_dir / "state" / "step-2", "pool")

    finished = _start(["--resume", str(run_dir)], None, tmp_path, _ray_head)
    output = finished.communicate(timeout=300)[0].decode()
    assert finished.returncode == 0, output[-3000:]

    assert _steps(run_dir) == [0, 1, 2, 3, 4]  # each learner step once, none missing
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["final"] is True
    assert _latest_step(run_dir) == 4 and not (run_dir / "state" / "step-2.tmp").exists()
    assert all((run_dir / "checkpoints" / f"ckpt-{k}" / "adapter_model.safetensors").exists() for k in range(1, 5))
    pool = resume.load_part(run_dir / "state" / "step-4", "pool")
    assert [c["uid"] for c in pool["checkpoints"]] == ["ckpt--1", "ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    assert pool["checkpoints"][0]["path"] == warm  # RL started from the warm start
    assert pool["games_played"] >= pool_at_2["games_played"]
    assert set(pool_at_2["ratings"]) <= set(pool["ratings"])
    learner = resume.load_part(run_dir / "state" / "step-4", "learner")
    adapter = load_file(run_dir / "checkpoints" / "ckpt-4" / "adapter_model.safetensors")
    weights = {name.replace(".default", ""): value for name, value in learner["policy"].items()}
    assert learner["step"] == 4 and weights.keys() == adapter.keys()
    assert all(torch.equal(weights[k], adapter[k]) for k in adapter)  # the state holds the served weights
    seeds = _game_seeds(tmp_path)
    assert len(seeds) == len(set(seeds)), "a resumed session replayed the game seeds of an earlier one"

    # killed in its final evaluation (every step's state saved, no final row): resumed, it evaluates again and ends
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in rows[:-1]))
    evaluated = _start(["--resume", str(run_dir)], None, tmp_path, _ray_head)
    output = evaluated.communicate(timeout=300)[0].decode()
    assert evaluated.returncode == 0, output[-3000:]
    assert _steps(run_dir) == [0, 1, 2, 3, 4]
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["final"] is True

    # a finished run resumed: it says so, exits 0 and writes nothing
    rows = (run_dir / "metrics.jsonl").read_text()
    again = _start(["--resume", str(run_dir)], None, tmp_path, _ray_head)
    output = again.communicate(timeout=300)[0].decode()
    assert again.returncode == 0 and "is finished" in output, output[-3000:]
    assert (run_dir / "metrics.jsonl").read_text() == rows and _latest_step(run_dir) == 4

    # its warm start deleted, a resume that would train on refuses in one line instead of starting elsewhere
    shutil.rmtree(run_dir / "warm-start")
    refused = _start(["--resume", str(run_dir), "--set", "learner.num_steps=5"], None, tmp_path, _ray_head)
    output = refused.communicate(timeout=300)[0].decode()
    last = output.strip().splitlines()[-1]
    assert refused.returncode == 2 and last.startswith("error: ") and "warm-start" in last, output[-3000:]
    assert (run_dir / "metrics.jsonl").read_text() == rows
