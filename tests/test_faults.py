"""Faults are isolated, counted and survived: an env that raises, an API opponent that times out, a generation
that is garbage and an inference server that dies each fail (or spoil) only their own game while collection and
learning go on; a non-finite loss skips its optimizer step, up to a limit; Ray restarts a dead inference actor."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time

import pytest
import torch

from unstable.agents import seating
from unstable.agents.api import APISettings
from unstable.algorithms import Reinforce
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.games import episode
from unstable.games.moves import legal_moves
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import EnvSpec, GenerationRequest, GenerationResult
from unstable.runtime.loop import LearnerLoop, RunStopped
from unstable.tracking import Tracker, keys
from unstable.tracking.history import read_rows

from .test_algorithms import _learner, _scored, bandit  # noqa: F401 - bandit is a fixture

pytestmark = pytest.mark.slow  # Ray and runs of unstable train

SPEC = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
CAUSES = ("ValueError", "APIOpponentError", "ActorDiedError")  # an env that raised, an API timeout, a dead server


class ActorDiedError(RuntimeError):
    """What a call to an inference actor whose process died raises (Ray's RayActorError, here without Ray)."""


class _FaultyEngine:
    """Legal moves, except every 5th reply is garbage and requests 30-39 find the server dead."""

    def __init__(self):
        self.rng = random.Random(0)
        self.requests = 0
        self.lock = threading.Lock()

    def generate(self, request):
        with self.lock:
            self.requests += 1
            n = self.requests
        if 30 <= n < 40:
            raise ActorDiedError("inference actor died")
        text = "\x00\ufffd garbage }}{{" if n % 5 == 0 else f"\\boxed{{{self.rng.choice(legal_moves(request.prompt))}}}"
        return GenerationResult(text, (1, 2), (3,), (-0.5,))

    def end_game(self, game):
        pass


class _CrashingEnv:
    """A TextArena env whose third `step` raises."""

    def __init__(self, env):
        self.env = env
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise ValueError("env crashed")
        return self.env.step(action)

    def __getattr__(self, name):
        return getattr(self.env, name)


@pytest.fixture
def faults(monkeypatch):
    """Every 4th env crashes; API opponents talk to a server that accepts and never answers."""
    created = iter(range(10**6))
    make_env = episode.make_env
    monkeypatch.setattr(episode, "make_env", lambda env_id: _wrap(make_env(env_id), next(created)))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr(
        seating.APISettings, "from_env", lambda: APISettings(base_url=url, timeout_s=0.2, max_retries=0)
    )
    yield
    silent.close()


def _wrap(env, index: int):
    return _CrashingEnv(env) if index % 4 == 3 else env


def test_faulty_games_are_counted_by_cause_and_learning_goes_on(tiny_model_dir, tmp_path, faults):
    pool = ModelPool(PoolConfig(sample_mode="random", fixed_opponents=["org/model", "random"]))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=256))
    tracker = Tracker(tmp_path)
    collector = Collector(_FaultyEngine(), pool, buffer, tracker, CollectorConfig(training_envs=[SPEC]))
    collecting = threading.Thread(target=collector.collect, args=(4,))
    collecting.start()
    learner = _learner(tiny_model_dir, Reinforce(), batch_size=8)
    loop = LearnerLoop(learner, buffer, pool, tracker, str(tmp_path))
    try:
        rows = loop.train(2)  # learning goes on while games fail around it
        deadline = time.time() + 60
        while len(tracker.failed_by_cause) < len(CAUSES) and time.time() < deadline:
            time.sleep(0.1)
    finally:
        collector.stop()
        collecting.join()
    row = tracker.log({})
    for cause in CAUSES:
        assert row[keys.FAILED_BY_CAUSE + cause] >= 1, row
    assert row[keys.TOTAL_FAILED_GAMES] >= 3 and row[keys.TOTAL_TRAIN_GAMES] > row[keys.TOTAL_FAILED_GAMES]
    assert [r[keys.STEP] for r in rows] == [1, 2] and pool.latest().uid == "ckpt-2"
    summaries = [r for r in read_rows(tmp_path) if r[keys.TRAIN_GAMES]]
    assert any(r[keys.FORMAT_OK_RATE] < 1.0 for r in summaries)  # garbage replies are counted as bad format


class _EngineThatCannotGenerate:
    """Every generation fails, as a learner whose weights the engine cannot load or run."""

    def generate(self, request):
        raise RuntimeError("the engine cannot generate")

    def end_game(self, game):
        pass


def test_when_every_training_game_fails_the_learner_stops_with_the_cause_instead_of_waiting(tiny_model_dir, tmp_path):
    pool = ModelPool(PoolConfig(sample_mode="random", fixed_opponents=["random"]))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=256))
    tracker = Tracker(tmp_path)
    cfg = CollectorConfig(training_envs=[SPEC], max_failed_games_in_a_row=20)
    collector = Collector(_EngineThatCannotGenerate(), pool, buffer, tracker, cfg)
    counts = {}
    collecting = threading.Thread(target=lambda: counts.update(collector.collect(4)), daemon=True)
    collecting.start()
    loop = LearnerLoop(_learner(tiny_model_dir, Reinforce(), batch_size=8), buffer, pool, tracker, str(tmp_path))
    stopped = []

    def train():
        try:
            loop.train(1)
        except RunStopped as exc:
            stopped.append(exc.reason)

    learning = threading.Thread(target=train, daemon=True)
    learning.start()
    learning.join(timeout=120)
    collector.stop()
    collecting.join(timeout=60)
    assert not learning.is_alive(), "the learner still waits for a batch that cannot come"
    assert stopped == [
        "no training batch can come: collection stopped: the last 20 training games all failed "
        "(collector.max_failed_games_in_a_row = 20), the last one with RuntimeError: the engine cannot generate"
    ]
    assert counts["train"] == counts["train_failed"] >= 20  # counted, and collection ended too
    assert tracker.log({})[keys.TOTAL_FAILED_GAMES] >= 20


def test_a_nan_loss_skips_its_step_and_too_many_in_a_row_stop_the_run(tiny_model_dir, bandit):  # noqa: F811
    learner = _learner(tiny_model_dir, Reinforce(), max_skipped_updates=1)
    good = [_scored(learner, bandit["prompt"], bandit["good"], 1.0)] * 4
    poisoned = [_scored(learner, bandit["prompt"], bandit["good"], float("nan"))] * 4
    before = learner.policy.trainable_state()
    metrics = learner.train_step(poisoned)
    assert metrics[keys.SKIPPED_UPDATES] == 1 and metrics[keys.SKIPPED_UPDATES_TOTAL] == 1 and learner.step == 1
    assert all(torch.equal(before[k], v) for k, v in learner.policy.trainable_state().items())  # untouched
    assert learner.train_step(good)[keys.SKIPPED_UPDATES] == 0  # a good batch steps again and resets the streak
    assert learner.train_step(poisoned)[keys.SKIPPED_UPDATES_TOTAL] == 2
    with pytest.raises(RuntimeError, match="learner.optimizer.max_skipped_updates = 1"):
        learner.train_step(poisoned)


@pytest.mark.usefixtures("shared_ray")  # joins the test process's Ray
def test_ray_restarts_a_dead_inference_actor_and_its_in_flight_request_fails():
    import ray

    from unstable.inference import InferenceConfig
    from unstable.runtime.actors import InferenceServerActor

    class SlowBackend:
        """Answers every request after a pause, so one is in flight when the actor dies; the answer names the
        sampling seed the engine was built with."""

        def __init__(self, seed=None):
            self.seed = seed

        def generate(self, requests):
            time.sleep(1.0)
            return [GenerationResult(f"\\boxed{{[4]}} {self.seed}", (1,), (2,), (-0.1,)) for _ in requests]

    ray.init()
    try:
        server = InferenceServerActor.options(max_restarts=1).remote(SlowBackend, InferenceConfig())
        ray.get(server.start.remote())
        first = ray.get(server.generate.remote(GenerationRequest("Your move: "))).text
        in_flight = server.generate.remote(GenerationRequest("Your move: "))
        time.sleep(0.3)
        ray.kill(server, no_restart=False)  # the process dies as from an OOM kill; Ray restarts it
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(in_flight, timeout=60)  # the game waiting on it fails and is counted
        answer = _generate_once_back(server).text  # the restarted actor loaded its engine by itself
        assert answer.startswith("\\boxed{[4]}")
        assert answer != first  # ... with a seed of its own: it does not replay the stream of the dead one
    finally:
        ray.shutdown()


def _inference_actors() -> list[dict]:
    """The inference actors of this test's Ray job (Ray's own state helper: no dashboard needed; a shared Ray's table
    also holds the actors of earlier jobs)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    actors = state.actors().values()
    return [a for a in actors if a["ActorClassName"] == "InferenceServerActor" and a["JobID"] == job]


def _wait_until_restarted(actor_id: str, timeout_s: float = 300.0) -> None:
    """Block until the inference actor `actor_id` is alive again after one restart."""
    deadline = time.time() + timeout_s
    while True:
        actor = next(a for a in _inference_actors() if a["ActorID"] == actor_id)
        if actor["State"] == "ALIVE" and actor["NumRestarts"] == 1:
            return
        assert time.time() < deadline, f"the killed inference actor never came back: {actor['State']}"
        time.sleep(0.5)


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_an_inference_actor_killed_mid_run_costs_only_games_in_flight_and_comes_back(tiny_model_dir, tmp_path):
    from unstable.config import load_config
    from unstable.inference.client import REST_S
    from unstable.runtime import train

    from .runs import EXAMPLE, TWO_ACTORS_LORA, run_rows, tiny_run

    overrides = tiny_run(tmp_path, tiny_model_dir, "killed-actor", "learner.num_steps=4", *TWO_ACTORS_LORA)
    killed = []

    def kill_after_step_1(row):
        if row.get(keys.STEP) == 1:  # SIGKILL its process, as an OOM kill would; the games go on meanwhile
            victim = _inference_actors()[0]
            os.kill(victim["Pid"], signal.SIGKILL)
            killed.append(victim["ActorID"])
        if row.get(keys.STEP) == 2:  # the learner waits for Ray to restart it, so the run does not end first,
            _wait_until_restarted(killed[0])
            time.sleep(REST_S)  # and for the client's rest of it to run out (a restart can take less than that)

    summary = train(load_config(EXAMPLE, overrides), on_row=kill_after_step_1)
    rows = run_rows(tmp_path / "killed-actor")
    assert killed and summary.learner_steps == 4 and summary.stopped is None  # the run went on and ended
    failed = rows[-1][keys.TOTAL_FAILED_GAMES]
    assert failed == summary.train_failed + summary.eval_end["failed"]  # every failed game counted
    assert failed <= 4, failed  # at most the games in flight when it died (collector.num_workers)
    for window in (rows[:2], rows[3:]):  # before the kill, and after the restart, games go to both actors
        served = [sum(r[keys.INFERENCE_REQUESTS_BY_ACTOR][actor] for r in window) for actor in range(2)]
        assert min(served) > 0, served
    assert rows[-1][keys.INFERENCE_POLICY_VERSION_BY_ACTOR] == [4, 4]  # ... on the newest adapter


def _generate_once_back(server, timeout_s: float = 60.0):
    """The first answer of `server` once Ray has restarted it (calls while it restarts fail like games would)."""
    import ray

    from unstable.records import GenerationRequest

    deadline = time.time() + timeout_s
    while True:
        try:
            return ray.get(server.generate.remote(GenerationRequest("Your move: ")), timeout=timeout_s)
        except ray.exceptions.ActorUnavailableError:
            assert time.time() < deadline, "the inference actor never came back"
            time.sleep(0.5)


class _SwitchingBackend:
    """Answers at once, in a process whose threads switch every microsecond (so the actor's racing calls are often
    caught between two of their statements)."""

    def __init__(self, seed=None):
        import sys

        sys.setswitchinterval(1e-6)

    def generate(self, requests):
        return [GenerationResult("\\boxed{[4]}", (1,), (2,), (-0.1,)) for _ in requests]


def _generate_until_refused(client, errors: list) -> None:
    """Ask `client` for completions until a call fails; keeps the failure."""
    from unstable.records import GenerationRequest

    while True:
        try:
            client.generate(GenerationRequest("Your move: "))
        except Exception as exc:  # noqa: BLE001 - the refusal is what the test looks at
            errors.append(exc)
            return


@pytest.mark.usefixtures("shared_ray")  # joins the test process's Ray
def test_every_game_asking_an_inference_actor_that_stops_gets_an_answer_or_an_error():
    import ray

    from unstable.inference import InferenceClient, InferenceConfig
    from unstable.runtime.actors import InferenceServerActor
    from unstable.runtime.remote import RemoteProxy

    ray.init()
    try:
        for _ in range(5):
            server = InferenceServerActor.remote(_SwitchingBackend, InferenceConfig(batch_wait_ms=0))
            ray.get(server.start.remote())
            client = InferenceClient([RemoteProxy(server)])
            errors: list[Exception] = []
            games = [threading.Thread(target=_generate_until_refused, args=(client, errors)) for _ in range(16)]
            for game in games:
                game.start()
            time.sleep(0.2)
            ray.get(server.stop.remote(), timeout=60)
            for game in games:
                game.join(timeout=30)
            assert not any(game.is_alive() for game in games), "a request to the stopped server never resolved"
            assert len(errors) == len(games) and all("inference server stopped" in str(e) for e in errors)
            ray.kill(server)
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("shared_ray")
def test_an_inference_actor_killed_while_its_engine_starts_is_started_again(tmp_path):
    """The run's start waits for every inference actor's `start`; one whose process died meanwhile is restarted by
    Ray and started again (before: the run ended at once, exit 2, 'the inference engine did not start:
    ActorUnavailableError', as if the engine had refused its config; found by benchmarks/chaos.py)."""
    import functools

    import ray

    from unstable.inference import InferenceConfig
    from unstable.runtime.actors import InferenceServerActor
    from unstable.runtime.topology import _start_surviving_restarts

    class DiesOnceWhileStarting:
        """A backend whose first build kills its process (as `kill -9` of an inference actor starting its engine
        would); the marker file `path` makes the next build, in the restarted process, succeed."""

        def __init__(self, path: str, seed=None):
            if not os.path.exists(path):
                open(path, "w").close()
                os._exit(1)

        def generate(self, requests):
            return [GenerationResult("\\boxed{[4]}", (1,), (2,), (-0.1,)) for _ in requests]

    ray.init()  # joins the test process's Ray (`shared_ray`)
    try:
        factory = functools.partial(DiesOnceWhileStarting, str(tmp_path / "started-once"))
        server = InferenceServerActor.options(max_restarts=1).remote(factory, InferenceConfig())
        _start_surviving_restarts(server, server.start.remote(), max_restarts=1)
        assert ray.get(server.generate.remote(GenerationRequest("Your move: "))).text == "\\boxed{[4]}"
    finally:
        ray.shutdown()


def _unstable_train(overrides: list[str], env: dict[str, str], timeout: float, hung: str) -> tuple[int, str, str]:
    """`unstable train` of the demo config with `overrides` in a process session of its own, `env` added to this
    one's: (status, stdout, stderr). A run still going after `timeout` seconds is killed whole and fails with `hung`."""
    import subprocess
    from pathlib import Path

    from .runs import EXAMPLE
    from .zygote import start_python

    command = ["-m", "unstable.cli.main", "train", str(EXAMPLE), *(arg for o in overrides for arg in ("--set", o))]
    run = start_python(command, cwd=Path.cwd(), env=os.environ | env, new_session=True)
    try:
        out, err = (stream.decode() for stream in run.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # the driver and every Ray process it started
        run.wait()
        raise AssertionError(hung) from None
    return run.returncode, out, err


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_a_run_whose_learner_cannot_play_after_its_first_update_stops_with_the_cause_and_status_1(
    tiny_model_dir, tmp_path
):
    import json

    from unstable.inference.server import FAIL_LOADS_ENV

    from .runs import tiny_run

    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "cannot-play",
        "learner.num_steps=20",  # more than the games in flight at the first update can feed
        "warm_start=null",
        "collector.max_failed_games_in_a_row=8",
        "evaluation.games_at_end=4",
    )  # the example fine-tunes every weight: each update is a full checkpoint the engine loads
    hung = "the run never ended: its learner still waits for a batch"
    status, out, err = _unstable_train(overrides, {FAIL_LOADS_ENV: "1"}, 400, hung)
    cause = (
        "no training batch can come: collection stopped: the last 8 training games all failed "
        "(collector.max_failed_games_in_a_row = 8), the last one with RuntimeError: full checkpoint "
    )
    assert status == 1, out[-2000:] + err[-3000:]
    assert err.splitlines()[-1].startswith(f"error: the run stopped: {cause}"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    failed = int(out.split("training games: ")[1].split("(")[1].split(" failed")[0])
    assert failed >= 8, out
    rows = [json.loads(line) for line in (tmp_path / "cannot-play" / "metrics.jsonl").read_text().splitlines()]
    steps = [r[keys.STEP] for r in rows if keys.STEP in r]
    assert steps == list(range(len(steps))) and 2 <= len(steps) < 21  # a few updates on the older games, no more
    assert rows[-1]["final"] and rows[-1][keys.RUN_STOPPED].startswith(cause)
    assert rows[-1][keys.TOTAL_FAILED_GAMES] >= 8 and rows[-1][keys.FAILED_BY_CAUSE + "RuntimeError"] >= 8


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_a_learner_that_makes_no_step_for_the_stall_timeout_stops_the_run_saying_what_each_part_did(
    tiny_model_dir, tmp_path
):
    """The learner stuck after its first row (the kill tests' pause point, never killed): with
    learner.stall_timeout_s 20 the run stops with the cause and the buffer's and collection's state, status 1 (it
    waited for ever before)."""
    import json

    from unstable.runtime.resume import PAUSE_ENV

    from .runs import tiny_run

    overrides = tiny_run(
        tmp_path, tiny_model_dir, "stalled", "learner.num_steps=3", "warm_start=null", "learner.stall_timeout_s=20"
    )
    hung = "the run never ended: the stuck learner held it"
    status, out, err = _unstable_train(overrides, {PAUSE_ENV: "after-log:2"}, 300, hung)
    assert status == 1, out[-2000:] + err[-3000:]
    cause = "the learner made no step for 20 s (learner.stall_timeout_s) at step 2: the buffer held"
    assert err.splitlines()[-1].startswith(f"error: the run stopped: {cause}"), err[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "stalled" / "metrics.jsonl").read_text().splitlines()]
    assert [r[keys.STEP] for r in rows if keys.STEP in r] == [0, 1, 2] and cause in rows[-1][keys.RUN_STOPPED]


def _ray_process(name: str, run_pid: int):
    """The live process of the run `run_pid`'s Ray actor whose title holds `name` (e.g. 'CollectorActor'), or None:
    one on the test process's Ray (`shared_ray`) started after the run, as an earlier run's actors may still be
    ending."""
    import psutil

    from .runs import ray_workers_since

    for process in ray_workers_since(psutil.Process(run_pid).create_time()):
        try:
            if name in " ".join(process.cmdline()):
                return process
        except psutil.NoSuchProcess:
            continue
    return None


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray: each kill is of one actor, not the run
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_a_part_killed_at_the_start_or_mid_run_stops_the_run_at_once_naming_it_and_the_run_resumes_to_its_end(
    tiny_model_dir, tmp_path
):
    """kill -9 of one part per session, each session resumed by the next:

    1. the tracker as soon as its process exists, while the other parts are still being built (the collector asks it
       for the run directory): the run stops with one line naming the dead part, status 1 (before: a Ray traceback);
    2. the collector's process, and 3. the pool's, each while the learner waits for its first batch (64 steps): the
       driver watches every part beside the learner's step, so the run stops at once saying which part failed
       (status 1). No count of failed games stops collection here. Before: a dead pool was named only once 1,000
       games in a row had failed, or as the learner's failure when it called the pool; and once the driver had
       stopped the collector, the learner's step waiting for a batch that could no longer come held the run for ever;
    4. resumed once more (with batches of 8, as a user may change the batch on resume), it finishes with every step
       logged once.

    All three were found by benchmarks/chaos.py."""
    import json
    import subprocess
    from pathlib import Path

    from .runs import EXAMPLE, tiny_run
    from .zygote import Forked, start_python

    overrides = tiny_run(
        tmp_path, tiny_model_dir, "killed", "learner.num_steps=4", "warm_start=null",
        "learner.resume_state.every_steps=1", "collector.max_failed_games_in_a_row=1000000000",
        "learner.batch_size=64", "buffer.max_buffer_size=64",
    )  # fmt: skip
    run_dir = tmp_path / "killed"
    metrics = run_dir / "metrics.jsonl"

    def start(*args: str) -> Forked:
        command = ["-m", "unstable.cli.main", "train", *args]
        return start_python(command, cwd=Path.cwd(), env=dict(os.environ), new_session=True)

    def waiting_for_its_first_batch(started: float) -> bool:
        """The session started at `started` logged its row 0 (a resume first cuts the rows after its saved state)."""
        return metrics.exists() and metrics.stat().st_mtime >= started and '"learner/step": 0' in metrics.read_text()

    def kill_part(run: Forked, actor: str, ready) -> str:
        """kill -9 of the run's `actor` process once `ready()`: the last line of the run's stderr, status 1."""
        deadline = time.time() + 240
        while not ready() or (victim := _ray_process(actor, run.pid)) is None:
            assert run.poll() is None and time.time() < deadline, f"the run ended or stalled before killing {actor}"
            time.sleep(0.05)
        victim.kill()
        try:
            _, err = (stream.decode() for stream in run.communicate(timeout=180))
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            raise AssertionError(f"the run never ended after its {actor} died") from None
        assert run.returncode == 1 and "Traceback" not in err, err[-3000:]
        return err.strip().splitlines()[-1]

    last = kill_part(start(str(EXAMPLE), *(a for o in overrides for a in ("--set", o))), "TrackerActor", lambda: True)
    assert last.startswith("error: the run stopped: ") and "TrackerActor died" in last, last
    for actor, part in [("CollectorActor", "collector"), ("ModelPoolActor", "model pool")]:
        started = time.time()
        last = kill_part(start("--resume", str(run_dir)), actor, lambda s=started: waiting_for_its_first_batch(s))
        assert f"the run stopped: the {part} failed " in last, last

    resumed = start("--resume", str(run_dir), "--set", "learner.batch_size=8")
    out, err = (stream.decode() for stream in resumed.communicate(timeout=300))
    assert resumed.returncode == 0, err[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r[keys.STEP] for r in rows if keys.STEP in r] == [0, 1, 2, 3, 4] and rows[-1]["final"] is True
