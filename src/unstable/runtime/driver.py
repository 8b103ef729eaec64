"""Runs a built topology: evaluate, collect and learn concurrently, evaluate again; and `train`, which does it all
(after the supervised warm start, when the config has one).

`run` works on any `Topology`, so every front end (the YAML/CLI path here, the original API's Ray actors) drives
the same actors the same way.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import yaml

from unstable import atomic
from unstable.config import ConfigError, RunConfig, load_config
from unstable.config.schema import run_config_data, with_absolute_paths
from unstable.records import GameRecord
from unstable.runtime import resume
from unstable.runtime.topology import Topology, build_topology, init_ray, resolve_model_path
from unstable.tracking import cannot_make, keys, new_run_dir, truncate_metrics, wdl_summary
from unstable.tracking.history import TABLES_FILE, final_row, read_rows

WARM_START_DIR = "warm-start"
# the config fields that name the policy a run is on: a resumed run keeps them
POLICY_FIELDS = ("model.path", "learner.policy.lora", "learner.policy.initial_lora_path", "warm_start")

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What a finished run reports; `eval_start`/`eval_end` are `eval_table`s (with their failed games).

    `stopped` says why the run could not train (it stopped early, or every final evaluation game failed);
    None for a run that did its work."""

    run_dir: str
    learner_steps: int
    train_games: int
    eval_start: dict[str, Any] = field(default_factory=dict)
    eval_end: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    warm_start_checkpoint: str | None = None
    train_failed: int = 0
    stopped: str | None = None
    already_finished: bool = False  # `--resume` of a run that had ended: nothing was run


def eval_table(records: list[GameRecord]) -> dict[str, Any]:
    """The learner seat's W/D/L over finished eval games (with Wilson intervals) and the failed-game count."""
    finished = [r for r in records if not r.failed]
    summary = wdl_summary(r.outcome(r.learner_player_ids[0]) for r in finished)
    return summary | {"failed": len(records) - len(finished)}


def run(
    topology: Topology,
    cfg: RunConfig,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    start_step: int = 0,
) -> RunSummary:
    """Evaluate the initial policy, train up to `cfg.learner.num_steps` updates while the collector plays, stop
    the collector, evaluate the final policy. Every row goes through the Tracker into `metrics.jsonl`. A run
    resumed at `start_step` > 0 skips the initial evaluation: its row 0, already in the file, holds the table.

    A learner that stops (RunStopped: no batch can come) ends the run without the final evaluation; the cause goes
    into the summary and the final row (`run/stopped`), as does a final evaluation whose every game failed."""
    import ray

    start = time.time()
    t = topology
    learner_ready = t.learner.initialize.remote()
    if start_step == 0:
        eval_start = eval_table(ray.get(t.collector.evaluate.remote(cfg.evaluation.games_at_start)))
    else:
        eval_start = _logged_start_evaluation(t.run_dir)
    ray.get(learner_ready)
    if start_step == 0:  # row 0: the initial policy's evaluation
        on_row(ray.get(t.tracker.log.remote({keys.STEP: 0, "eval_start": eval_start})))
    counts, step, stopped, stalled, eval_end = {"train": 0, "train_failed": 0}, start_step, None, False, {}
    if start_step < cfg.learner.num_steps:  # a run killed in its final evaluation has no step left to collect for
        step, stopped, stalled, counts = _train_while_collecting(t, cfg, on_row, start_step)
    if not stalled:  # a learner stuck in a step keeps its last saved state as the run's
        _close_learner(t, stopped)
    if stopped is None:
        eval_end = eval_table(ray.get(t.collector.evaluate.remote(cfg.evaluation.games_at_end)))
        stopped = _unable_to_play(eval_end)
    final = {"eval_start": eval_start, "eval_end": eval_end, "final": True, keys.RUN_STOPPED: stopped}
    try:
        ray.get(t.tracker.log.remote(final))
        ray.get(t.tracker.close.remote())
    except ray.exceptions.RayError as exc:
        if stopped is None:
            raise
        log.error("the final row was not written after the run stopped (%s): %s", stopped, _ray_cause(exc))
    wall = time.time() - start
    return RunSummary(
        str(t.run_dir),
        step,
        counts["train"],
        eval_start,
        eval_end,
        wall,
        train_failed=counts["train_failed"],
        stopped=stopped,
    )


def _train_while_collecting(
    t: Topology, cfg: RunConfig, on_row: Callable[[dict[str, Any]], None], step: int
) -> tuple[int, str | None, bool, dict[str, int]]:
    """Train from `step` up to `cfg.learner.num_steps` while the collector plays; returns the steps done, why the
    run stopped (None: it did not), whether the learner is stuck in a step (`learner.stall_timeout_s`) and the
    collector's game counts. A part of the run that fails or dies stops it at once, named: the learner (or a part
    it calls) by its step's error, the collector, pool, buffer and tracker by `_Watch`, beside the learner's step."""
    import ray

    from unstable.runtime.loop import RunStopped

    counts, stopped, stalled, slowest = {"train": 0, "train_failed": 0}, None, False, 0.0
    collecting = t.collector.collect.remote(cfg.collector.num_workers, cfg.collector.num_eval_workers)
    watch = _Watch(collecting, {"model pool": t.model_pool, "step buffer": t.step_buffer, "tracker": t.tracker})
    try:
        while step < cfg.learner.num_steps:
            began, limit = time.monotonic(), stall_limit(cfg, slowest)
            on_row(_learner_row(t.learner.train.remote(1, stop_collection=False), watch, limit))
            slowest = max(slowest, time.monotonic() - began)
            step += 1
    except RunStopped as exc:
        stopped = exc.reason
    except ray.exceptions.GetTimeoutError:
        stopped, stalled = _stall_cause(t, cfg, limit, step + 1), True
    except _PartFailed as exc:
        stopped = f"the {exc.part} failed at step {step + 1}: {_ray_cause(exc.__cause__)}"
    except ray.exceptions.RayError as exc:  # an update failed, or the learner or a part it calls died
        part = watch.failed_part()  # the pool, say, died in a call of the learner's: named, not the learner
        cause = _ray_cause(part.__cause__) if part else _ray_cause(exc)
        stopped = f"the {part.part if part else 'learner'} failed at step {step + 1}: {cause}"
    if stopped is not None:
        _end_waiting_step(t, stopped)
    try:
        ray.get(t.collector.stop.remote())
        counts = ray.get(collecting)
    except ray.exceptions.RayError as exc:  # it died after the last check
        if stopped is None:
            stopped = f"the collector failed after step {step}: {_ray_cause(exc)}"
        else:
            log.error("the collector did not stop cleanly after the run stopped: %s", _ray_cause(exc))
    return step, stopped, stalled, counts


WATCH_EVERY_S = 1.0  # how often the parts beside the learner are looked at during its step


class _PartFailed(RuntimeError):
    """A part of the run beside the learner failed (its process died): raised from its Ray error."""

    def __init__(self, part: str):
        super().__init__(f"the {part} failed")
        self.part = part


class _Watch:
    """The parts beside the learner, watched while it steps: the collector through its `collect` call, the others
    (`parts`: name -> actor handle) through one ping (`__ray_ready__`) each in flight at a time. A ping that has not
    come back is no failure (a busy part answers later); one that fails names its part."""

    def __init__(self, collecting, parts: dict[str, Any]):
        self.collecting = collecting  # None once collection ended cleanly (stopped: the learner says why)
        self.parts = parts
        self.pings: dict[str, Any] = {}

    def check(self) -> set[str]:
        """Raise _PartFailed for a part found dead; else the parts that answered since the last check (pinged again
        on the next)."""
        import ray

        for name, handle in self.parts.items():
            if name not in self.pings:
                self.pings[name] = handle.__ray_ready__.remote()
        calls = {"collector": self.collecting} if self.collecting is not None else {}
        calls |= self.pings
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=0)
        answered = {name for name, call in calls.items() if call in ready}
        for name in answered:
            try:
                ray.get(calls[name])
            except ray.exceptions.RayError as exc:
                raise _PartFailed(name) from exc
            if name == "collector":
                self.collecting = None
            else:
                del self.pings[name]
        return answered

    def failed_part(self, wait_s: float = 10.0) -> _PartFailed | None:
        """The failure of a watched part found dead before every other one answered (at most `wait_s`), or None."""
        deadline, answered = time.monotonic() + wait_s, set()
        while not answered >= set(self.parts) and time.monotonic() < deadline:
            try:
                answered |= self.check()
            except _PartFailed as failure:
                return failure
            time.sleep(0.1)
        return None


def _learner_row(train, watch: _Watch, limit: float) -> dict[str, Any]:
    """The row of the learner's step `train` (a Ray call), watching the other parts every `WATCH_EVERY_S`: raises
    GetTimeoutError after `limit` seconds, _PartFailed as soon as another part is found dead."""
    import ray

    deadline = time.monotonic() + limit
    while True:
        ready, _ = ray.wait([train], timeout=min(WATCH_EVERY_S, max(deadline - time.monotonic(), 0.0)))
        watch.check()  # at every step too: steps from a full buffer can come faster than WATCH_EVERY_S
        if ready:
            return ray.get(train)[0]
        if time.monotonic() >= deadline:
            raise ray.exceptions.GetTimeoutError(f"no learner step in {limit:.0f} s")


def _ray_cause(exc: BaseException) -> str:
    """One line for a Ray error: the first line of its cause, and the actor that died when one did."""
    text = str(getattr(exc, "cause", None) or exc).strip()
    dead = re.search(r"class_name: (\w+)", text)
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{first} ({dead.group(1)} died)" if dead else first


STALL_FLOOR_S = 600.0  # the default stall timeout's least value
STALL_STEPS = 20.0  # ... and its multiple of the slowest step so far


def stall_limit(cfg: RunConfig, slowest_step_s: float) -> float:
    """Seconds the learner may take for one step before the run stops as stalled: `learner.stall_timeout_s`, else
    the larger of `STALL_FLOOR_S` and `STALL_STEPS` x the slowest step so far."""
    return cfg.learner.stall_timeout_s or max(STALL_FLOOR_S, STALL_STEPS * slowest_step_s)


def _stall_cause(topology: Topology, cfg: RunConfig, limit: float, step: int) -> str:
    """Why the run stops when learner step `step` has not come in `limit` seconds, with what the other parts were
    doing (each asked with a short timeout of its own: one may be stuck too)."""
    import ray

    def ask(call, default):
        try:
            return ray.get(call, timeout=10.0)
        except ray.exceptions.RayError:
            return default

    t = topology
    size = ask(t.step_buffer.size.remote(), "?")
    collection = ask(t.step_buffer.stop_cause.remote(), None)
    playing = ask(t.model_pool.in_play.remote(), [])
    return (
        f"the learner made no step for {limit:.0f} s (learner.stall_timeout_s) at step {step}: the buffer held {size} "
        f"of the {cfg.learner.batch_size} steps an update takes; collection "
        f"{'stopped: ' + collection if collection else 'was running'}; the games in flight played checkpoints "
        f"{playing or 'none'}"
    )


CALL_AFTER_STOP_S = 120.0  # the longest wait for a call to a part after the run stopped (the learner's close)


def _end_waiting_step(topology: Topology, stopped: str) -> None:
    """Collection stopped at the buffer with the run's cause, so that a learner step still waiting for a batch (the
    pool or the tracker died, which the learner does not call while it waits) ends instead of holding `close` behind
    it for ever; a buffer that cannot be told (dead) has already failed that step."""
    import ray

    try:
        ray.get(topology.step_buffer.stop_collection.remote(stopped), timeout=CALL_AFTER_STOP_S)
    except ray.exceptions.RayError as exc:
        log.error("the buffer was not told that the run stopped (%s): %s", stopped, _ray_cause(exc))


def _close_learner(topology: Topology, stopped: str | None) -> None:
    """The learner's last state written (`LearnerLoop.close`); after a stop, a failure to write it (or no answer in
    `CALL_AFTER_STOP_S`) is logged (the previous state stays), not raised over the cause."""
    import ray

    try:
        ray.get(topology.learner.close.remote(), timeout=None if stopped is None else CALL_AFTER_STOP_S)
    except ray.exceptions.RayError as exc:
        if stopped is None:
            raise
        log.error("the last state was not written after the run stopped (%s): %s", stopped, _ray_cause(exc))


def _logged_start_evaluation(run_dir: Path) -> dict[str, Any]:
    """The start-of-run evaluation table a resumed run logged in its row 0 (empty for a run logged before row 0
    held it)."""
    rows = read_rows(run_dir)
    return next((row["eval_start"] for row in rows if row.get(keys.STEP) == 0 and "eval_start" in row), {})


def _unable_to_play(table: dict[str, Any]) -> str | None:
    """The cause when every game of an evaluation (an `eval_table`) failed: the learner cannot play; else None."""
    if table["failed"] and not table["games"]:
        return f"every one of the {table['failed']} final evaluation games failed: the learner cannot play"
    return None


def warm_start(
    cfg: RunConfig, run_dir: Path, on_epoch: Callable[[dict[str, Any]], None] = lambda row: None
) -> RunConfig:
    """Run `cfg.warm_start` (`learner.sft.warm_start`) in the first training env, with the learner's LoRA shape (or
    every weight) and all CPU threads, into `run_dir/warm-start/`. Returns `cfg` starting RL from that checkpoint:
    the new `model.path` when fully fine-tuning, else `learner.policy.initial_lora_path`. `on_epoch` gets each pass's
    `{"epoch", "loss", "updates", "moves"}`."""
    from unstable.learner.sft import warm_start as supervised_warm_start

    checkpoint = supervised_warm_start(
        resolve_model_path(cfg),
        cfg.collector.training_specs()[0],
        cfg.warm_start,
        policy=cfg.learner.policy.model_copy(update={"initial_lora_path": None}),
        out_dir=str(run_dir / WARM_START_DIR),
        seed=cfg.run.seed,
        on_epoch=lambda row: _after_epoch(row, run_dir, on_epoch),
    )
    if cfg.learner.policy.lora is None:
        model_cfg = cfg.model.model_copy(update={"path": checkpoint, "build_tiny_if_missing": False})
        return cfg.model_copy(update={"model": model_cfg})
    policy = cfg.learner.policy.model_copy(update={"initial_lora_path": checkpoint})
    return cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"policy": policy})})


def _after_epoch(row: dict[str, Any], run_dir: Path, on_epoch: Callable[[dict[str, Any]], None]) -> None:
    on_epoch(row)
    resume.pause_for_test(run_dir, "warm-start", row["epoch"])


def train(
    cfg: RunConfig,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    on_warm_start_epoch: Callable[[dict[str, Any]], None] = lambda row: None,
) -> RunSummary:
    """The whole run, one resumable job: a fresh run directory with the config, then `_job` (the warm start if
    configured, the topology on Ray, `run`, shutdown)."""
    check_run_dir(cfg)
    check_resources(cfg)
    run_dir = new_run_dir(cfg.run.path)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(cfg, run_dir)
    return _job(cfg, run_dir, on_row, on_warm_start_epoch, None)


def resume_training(
    run_dir: str | Path,
    overrides: list[str] | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    on_warm_start_epoch: Callable[[dict[str, Any]], None] = lambda row: None,
) -> RunSummary:
    """Continue the run in `run_dir` from wherever it stopped, with its own `config.yaml` plus `overrides` (e.g. a
    larger `learner.num_steps`; none that changes the policy the run is on).

    A run killed before its warm start ended redoes it; one killed later goes on from its last complete saved
    state (see `runtime.resume`), or from its warm start when none was saved yet. `metrics.jsonl` keeps its rows
    up to the saved step and the resumed run appends from the next, so no learner step is logged twice or
    missing. A finished run is left as it is (its summary has `already_finished`). A bad directory, corrupt
    state or changed policy raises ResumeError here, before Ray starts.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise resume.ResumeError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", overrides, run_dir=run_dir)
    _check_same_policy(load_config(run_dir / "config.yaml", run_dir=run_dir), cfg)
    check_resources(cfg)
    point = resume.latest_state(run_dir)
    finished = _finished_summary(cfg, run_dir, point)
    if finished is not None:
        return finished
    for rows in ("metrics.jsonl", TABLES_FILE):
        truncate_metrics(run_dir / rows, point[0] if point else -1)
    write_config(cfg, run_dir)
    return _job(cfg, run_dir, on_row, on_warm_start_epoch, point)


def _job(
    cfg: RunConfig,
    run_dir: Path,
    on_row: Callable[[dict[str, Any]], None],
    on_warm_start_epoch: Callable[[dict[str, Any]], None],
    point: tuple[int, Path] | None,
) -> RunSummary:
    """The one way into a run, new or resumed: the warm start while the config still has one, then RL on Ray from
    the saved state `point` (None: from the start)."""
    start = time.time()
    if cfg.warm_start is not None:
        cfg = _warm_start_once(cfg, run_dir, on_warm_start_epoch)
    summary = _run_on_ray(cfg, run_dir, on_row, point)
    summary.warm_start_checkpoint = _warm_start_checkpoint(cfg, run_dir)
    summary.wall_seconds = time.time() - start
    return summary


def _warm_start_once(cfg: RunConfig, run_dir: Path, on_epoch: Callable[[dict[str, Any]], None]) -> RunConfig:
    """Run the warm start from scratch (what a killed one left is discarded; the redo is the same, seeded by the
    run's seed), then mark it done by rewriting `config.yaml`, atomically, to start RL from its checkpoint with no
    warm start: until that rename a kill leaves a run that warm-starts again, after it one that never does."""
    shutil.rmtree(run_dir / WARM_START_DIR, ignore_errors=True)
    cfg = warm_start(cfg, run_dir, on_epoch).model_copy(update={"warm_start": None})
    write_config(cfg, run_dir)
    return cfg


def _warm_start_checkpoint(cfg: RunConfig, run_dir: Path) -> str | None:
    """The run's own warm-start checkpoint (in `run_dir/warm-start/`) that RL starts from, None when it has none."""
    path = cfg.model.path if cfg.learner.policy.lora is None else cfg.learner.policy.initial_lora_path
    inside = path is not None and Path(path).resolve().is_relative_to((run_dir / WARM_START_DIR).resolve())
    return path if inside else None


def _check_same_policy(saved: RunConfig, cfg: RunConfig) -> None:
    """Refuse overrides that would resume from a policy other than the one the run is on."""
    for name in POLICY_FIELDS:
        before, after = (reduce(getattr, name.split("."), c) for c in (saved, cfg))
        if before != after:
            raise resume.ResumeError(
                f"--set {name}: a resumed run goes on from the policy it was on ({name} = {before!r}), "
                f"not {after!r}; start a new run instead"
            )


def _finished_summary(cfg: RunConfig, run_dir: Path, point: tuple[int, Path] | None) -> RunSummary | None:
    """The summary of a run that already ended at `cfg.learner.num_steps` (its final row written), else None;
    refuses a `num_steps` below the saved step, which would end the run at a policy it has left."""
    if point is None:
        return None
    total = cfg.learner.num_steps
    if point[0] > total:
        raise resume.ResumeError(
            f"learner.num_steps = {total}: the run in {run_dir} is at learner step {point[0]} already; "
            f"give {point[0]} or more"
        )
    metrics = run_dir / "metrics.jsonl"
    final = final_row(read_rows(run_dir)) if point[0] == total and metrics.exists() else {}
    if not final:
        return None
    return RunSummary(
        str(run_dir),
        total,
        final.get(keys.TOTAL_TRAIN_GAMES, 0),
        final["eval_start"],
        final["eval_end"],
        warm_start_checkpoint=_warm_start_checkpoint(cfg, run_dir),
        already_finished=True,
    )


def write_config(cfg: RunConfig, run_dir: Path) -> None:
    """The run's config as `run_dir/config.yaml` (written atomically: resume reads it), its local paths absolute or
    relative to `run_dir` (`run_config_data`)."""
    atomic.write_text(run_dir / "config.yaml", yaml.safe_dump(run_config_data(cfg, run_dir), sort_keys=False))


def check_run_dir(cfg: RunConfig) -> None:
    """Fail before anything is created when the run directory `run.dir/run.name` cannot be made (`cannot_make`)."""
    problem = cannot_make(cfg.run.path)
    if problem:
        raise ConfigError(f"run.dir = {cfg.run.dir!r}: cannot make the run directory {cfg.run.path}: {problem}")


def check_resources(cfg: RunConfig) -> None:
    """Fail before any heavy start (the warm start included) when the run asks for more GPUs than this machine has
    (on a local Ray; a cluster given by RAY_ADDRESS is not checked here), caps the CPUs of a Ray cluster it joins,
    or serves LoRA adapters of a rank vLLM cannot take."""
    import torch

    if cfg.inference.backend == "vllm" and cfg.served_lora_rank is not None:
        from unstable.inference.vllm_backend import engine_lora_rank  # imports vLLM, which the run needs anyway

        try:
            engine_lora_rank(cfg.served_lora_rank)
        except ValueError as exc:
            raise ConfigError(
                f"learner.policy.lora.lora_rank: the run serves LoRA rank {cfg.served_lora_rank} (its learner's or "
                f"an adapter opponent's) with inference.backend = vllm: {exc}"
            ) from None

    if cfg.run.num_cpus is not None and "RAY_ADDRESS" in os.environ:
        raise ConfigError(
            f"run.num_cpus = {cfg.run.num_cpus}: a run that joins a Ray cluster (RAY_ADDRESS is set) uses the CPUs its "
            "nodes were started with; leave run.num_cpus unset"
        )
    learner, inference = cfg.learner, cfg.inference
    needed = learner.num_gpus * learner.num_learners + inference.num_gpus * inference.num_actors
    have = torch.cuda.device_count()
    if needed > have and "RAY_ADDRESS" not in os.environ:
        raise ConfigError(
            f"inference.num_gpus = {inference.num_gpus} x inference.num_actors = {inference.num_actors} + "
            f"learner.num_gpus = {learner.num_gpus} x learner.num_learners = {learner.num_learners}: {needed} GPUs, "
            f"but this machine has {have}"
        )


def _run_on_ray(
    cfg: RunConfig, run_dir: Path, on_row: Callable[[dict[str, Any]], None], point: tuple[int, Path] | None
) -> RunSummary:
    """Start (or join) Ray, build the topology of `cfg` with its local paths absolute (`with_absolute_paths`), restore
    the saved state `point` (`resume.latest_state`) if given, `run`, and leave Ray (stopping it if the run started
    it)."""
    import ray

    cfg = with_absolute_paths(cfg)
    init_ray(cfg)
    start_step = point[0] if point else 0
    try:
        topology = build_topology(cfg, run_dir, resume_step=start_step)
        start_step = ray.get(topology.learner.restore.remote(str(point[1]))) if point else 0
        return run(topology, cfg, on_row, start_step)
    except ray.exceptions.RayError as exc:  # a part died while the run started or ended, outside a learner step
        stopped = f"a part of the run failed while it started or ended: {_ray_cause(exc)}"
        return RunSummary(str(run_dir), start_step, 0, stopped=stopped)
    finally:
        ray.shutdown()
