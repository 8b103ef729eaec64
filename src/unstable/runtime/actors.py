"""The Ray actors: thin shells around the plain components, each taking its component's settings section whole.

This is the one place where the components become Ray actors. `runtime.topology` starts them, as peers, for both
front ends: the YAML/CLI path (`build_topology`) and the original API (`runtime.original_api`, which translates its
keywords into the same sections). Each shell subclasses its plain class, so every method of the component is an
actor method; other actors' handles are wrapped in `RemoteProxy` so the plain code calls them like local objects.
Shells reserve no Ray CPU (their work is waiting or is placed by GPUs), so a whole run fits on a 2-CPU machine.

Across nodes: the actors that write the run directory run on the driver's node (`runtime.topology`); an inference
actor on another node gets the checkpoints written there through Ray's object store (`CheckpointSource`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from unstable.algorithms.base import BaseAlgo
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig, RewardStages
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.config.schema import check_model_path
from unstable.inference import InferenceClient, InferenceConfig, InferenceServer
from unstable.inference.checkpoints import CheckpointCache, CheckpointFiles
from unstable.learner import Learner, LearnerConfig, PolicyModel
from unstable.learner.learner import learner_parts
from unstable.learner.parallel import DataParallel, free_port
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.runtime.loop import LearnerLoop
from unstable.runtime.remote import RemoteProxy
from unstable.tracking import Tracker, TrackerConfig
from unstable.tracking.sinks import make_sinks

log = logging.getLogger(__name__)

# Every shell's options. Ray's GCS keeps an event record (~3.5 KB) of every actor call, up to 100,000 of them: a
# run's thousands of calls per learner step (each generation, each step pushed) would hold hundreds of MB there
# and grow its memory for days. Nothing here reads those records (the Ray dashboard's task list would).
SHELL = {"num_cpus": 0, "enable_task_events": False}
# Inference actor calls beside the games' requests: starting, weights and adapters, statistics, stopping.
CONTROL_CALLS = 16
# An inference actor on another node keeps this many checkpoints per resident adapter (`max_loras`) copied: the
# resident ones plus as many recently used (vLLM may read an adapter's files again after loading it once).
CACHED_PER_LORA = 2


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Ray's scheduling strategy that places an actor or task on node `node_id` and nowhere else."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


@ray.remote(num_cpus=0)
def model_problem(model_path: str) -> str | None:
    """What is wrong with `model_path` as a base model on the node this task runs on (`check_model_path`), None
    when nothing is."""
    try:
        check_model_path(model_path)
    except ValueError as exc:
        return str(exc)
    return None


def log_to_run_dir(run_dir: str | Path, component: str) -> None:
    """Also write this process's `unstable` log records (warnings and errors: failed games, API retries, ...)
    to `run_dir/logs/<component>.log`, one file per component (the original UnstableBaselines README's "separate
    the logs")."""
    path = Path(run_dir) / "logs" / f"{component}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("unstable").addHandler(handler)


def _log_with(tracker, component: str) -> None:
    """`log_to_run_dir` under the run directory of `tracker` (an actor handle; None: no file)."""
    if tracker is not None:
        log_to_run_dir(ray.get(tracker.get_run_dir.remote()), component)


def _register_source(tracker) -> None:
    """Let `tracker` (an actor handle or None) read this actor's `metrics()` into every row."""
    if tracker is not None:
        me = ray.get_runtime_context().current_actor
        ray.get(tracker.add_source.remote(RemoteProxy(me)))


@ray.remote(**SHELL)
class TrackerActor(Tracker):
    """The Tracker of the run directory `run_dir` under `cfg`, its W&B run (if any) named `run_name`."""

    def __init__(self, cfg: TrackerConfig, run_dir: str, run_name: str):
        directory = Path(run_dir)
        super().__init__(directory, make_sinks(cfg, directory, run_name), cfg)
        log_to_run_dir(directory, "tracker")


@ray.remote(**SHELL)
class StepBufferActor(StepBuffer):
    """The StepBuffer under `cfg`, its reward stages built from `cfg` unless given built (`stages`); `tracker` (an
    actor handle, or None) reads its metrics into every row."""

    def __init__(self, cfg: BufferConfig, tracker=None, *, stages: RewardStages | None = None, seed: int = 0):
        super().__init__(cfg, stages=stages, seed=seed)
        _register_source(tracker)
        _log_with(tracker, "step_buffer")


@ray.remote(**SHELL)
class ModelPoolActor(ModelPool):
    """The ModelPool under `cfg`; `tracker` (an actor handle, or None) reads its metrics into every row."""

    def __init__(self, cfg: PoolConfig, tracker=None, *, seed: int = 0):
        super().__init__(cfg, seed=seed)
        _register_source(tracker)
        _log_with(tracker, "model_pool")


@ray.remote(**SHELL, max_concurrency=CONTROL_CALLS)
class CheckpointSource(CheckpointFiles):
    """The checkpoint directories of its node's disk (where the learner writes them), in chunks, for inference actors
    on other nodes; the chunks reach them through Ray's object store."""


@dataclass(frozen=True)
class InferenceGroup:
    """A run's started inference server actors (`topology.start_inference_group`), serving the base model at
    `model_path` under `cfg`: the collector sends its games' requests to them (`client`), the learner hands them each
    new policy."""

    servers: list
    cfg: InferenceConfig
    model_path: str

    def client(self) -> InferenceClient:
        """A client that routes requests over the servers by `cfg.routing`, those of an actor that died to the
        others (`_actor_gone`)."""
        proxies = [RemoteProxy(server) for server in self.servers]
        return InferenceClient(proxies, by_game=self.cfg.routing == "game", unavailable=_actor_gone)


@ray.remote(**SHELL, max_concurrency=8)
class CollectorActor(Collector):
    """The Collector under `cfg`, its games' moves asked of the inference group `inference`.

    Finished games go to the buffer, the pool and the tracker without waiting for an answer; per game the collector
    waits only for its opponents (`ModelPool.sample_match`). A resumed run passes the learner step it resumed from as
    `resume_step`: its games then draw seeds that no earlier session of the run used.
    """

    def __init__(
        self,
        cfg: CollectorConfig,
        inference: InferenceGroup,
        step_buffer,
        model_pool,
        tracker,
        *,
        seed: int = 0,
        resume_step: int = 0,
    ):
        _log_with(tracker, "collector")
        client = inference.client()
        super().__init__(
            client,
            RemoteProxy(model_pool, fire_and_forget={"record_game", "hold", "release"}),
            RemoteProxy(step_buffer, fire_and_forget={"add_game"}),
            RemoteProxy(tracker, fire_and_forget={"add_game"}),
            cfg,
            tokenizer=_chat_tokenizer(cfg, inference.model_path),
            seed=seed,
            resume_step=resume_step,
        )
        ray.get(tracker.add_source.remote(client))
        _register_source(tracker)  # the games held back by pacing


# the threads of an inference actor created without `max_concurrency` (a run sizes it to its games in flight): Ray
# starts them all at the actor's first call and kills the actor when that takes over 10 s, which 4,112 threads did
# on a loaded 2-core machine
DEFAULT_REQUESTS_IN_FLIGHT = 64


@ray.remote(**SHELL, max_concurrency=DEFAULT_REQUESTS_IN_FLIGHT + CONTROL_CALLS)
class InferenceServerActor(InferenceServer):
    """An inference server Ray restarts (up to `InferenceConfig.max_restarts` times) when its process dies.

    `backend_factory(seed=...)` builds its engine, sampling from the stream `seed` names (one per actor, see
    `topology.start_inference_group`). A restarted one loads its engine again at once, with `seed` mixed with a
    fresh restart nonce so it does not replay the stream its dead process began. Meanwhile the collector's
    `InferenceClient` sends its requests to the other actors (`_actor_gone`); with none, the games waiting on it fail
    (counted in `collector/failed_games` and by cause) and the collector starts new games in their place.

    An actor on another node than `checkpoint_node` (the node whose disk holds the checkpoints; None: every node
    sees them) loads every checkpoint from a node-local cache, fetched from `source` (a `CheckpointSource` there).
    """

    def __init__(
        self, backend_factory, cfg: InferenceConfig, seed: int = 0, checkpoint_node: str | None = None, source=None
    ):
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            nonce = secrets.randbits(32)
            seed = mixed_seed(seed, nonce)
            log.warning(
                "inference server restarted after its process died: loading the engine again, sampling seed %d "
                "(restart nonce %d)",
                seed,
                nonce,
            )
        super().__init__(
            functools.partial(backend_factory, seed=seed), cfg, _checkpoint_cache(cfg, checkpoint_node, source)
        )
        if restarted:
            self.start()


def _actor_gone(exc: BaseException) -> bool:
    """Whether `exc`, raised by a call to an inference actor, says its process died (and Ray restarts it): the
    request never ran there, or its answer is lost, so another actor may serve it."""
    return isinstance(exc, ray.exceptions.RayActorError)


def _checkpoint_cache(cfg: InferenceConfig, checkpoint_node: str | None, source) -> CheckpointCache | None:
    """A node-local cache of the checkpoints fetched from `source`, when this actor's node is not `checkpoint_node`
    (Ray's node ids, not a probe of the filesystem, which a shared mount would fool); else None."""
    here = ray.get_runtime_context().get_node_id()
    if checkpoint_node is None or here == checkpoint_node:
        return None
    cache = CheckpointCache(RemoteProxy(source), capacity=CACHED_PER_LORA * cfg.max_loras)
    log.warning(
        "inference actor on node %s: checkpoints of node %s are fetched into %s", here, checkpoint_node, cache.root
    )
    return cache


def mixed_seed(*parts: int) -> int:
    """A 32-bit seed hashed from `parts` (vLLM also seeds numpy with it, which takes 32 bits): an inference actor's
    own sampling stream."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def _chat_tokenizer(cfg: CollectorConfig, model_path: str):
    """The tokenizer, only when a game uses the `default` (chat template) prompt."""
    if not any(e.prompt_template == "default" for e in cfg.training_envs + cfg.evaluation_envs):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@ray.remote(**SHELL)
class LearnerActor(LearnerLoop):
    """The learner loop under `cfg`, training the base model at `model_path` (weights in `dtype`) with `algorithm`:
    rank 0 of the learner group (`topology.start_learner_group`).

    Checkpoints go under the tracker's run directory. The model trains on cuda when `cfg.num_gpus` says so, or when
    Ray gave this actor GPUs that torch sees (`_on_given_gpus`). It has no sampling settings of its own: each step is
    scored under the temperature and top_p it was sampled with. Given the other ranks' actors (`ranks`, in rank
    order: `LearnerRankActor`s) it joins them in one process group at its node's address and calls them with its
    own learner (`RankZeroLearner`). Given `inference_servers` and `cfg.weight_handover` 'memory', it hands each
    new policy to them through Ray's object store (`hand_over`); else they load each checkpoint's folder.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        step_buffer,
        model_pool,
        tracker,
        algorithm: BaseAlgo,
        *,
        dtype: str = "float32",
        inference_servers: list | None = None,
        ranks: list | None = None,
    ):
        cfg = _on_given_gpus(cfg)
        policy, parallel = learner_parts(model_path, cfg, dtype=dtype)
        run_dir = ray.get(tracker.get_run_dir.remote())
        log_to_run_dir(run_dir, "learner")
        if ranks:
            learner = RankZeroLearner(policy, algorithm, cfg, parallel, ranks)
        else:
            learner = Learner(policy, algorithm, cfg, parallel)
        in_memory = inference_servers and cfg.weight_handover == "memory"
        super().__init__(
            learner,
            RemoteProxy(step_buffer),
            RemoteProxy(model_pool),
            RemoteProxy(tracker),
            run_dir,
            handover=functools.partial(hand_over, inference_servers) if in_memory else None,
        )

    def train(self, num_steps: int, stop_collection: bool = True) -> list[dict[str, Any]]:
        """`num_steps` updates; then, unless told otherwise, write the last state (`close`) and tell the collector to
        start no new games."""
        rows = super().train(num_steps)
        if stop_collection:
            self.close()
            self.step_buffer.stop_collection()
        return rows


def hand_over(servers: list, checkpoint, served) -> bool:
    """Offer a new policy's `served` weights for `checkpoint` to every inference actor in `servers`, put in Ray's
    object store once; returns whether every one took them in memory. An actor that died since (Ray restarts it)
    counts as one that did not: it reads the checkpoint's folder."""
    shared = ray.put(served)
    offers = [server.offer.remote(checkpoint, shared) for server in servers]
    try:
        return all(ray.get(offers))
    except ray.exceptions.RayActorError:
        return False


def _on_given_gpus(cfg: LearnerConfig) -> LearnerConfig:
    """`cfg`, with `num_gpus` the GPUs Ray gave this learner actor when it has some that torch sees and `cfg` names
    none (the original API gives them in the actor's options, `StandardLearner.options(num_gpus=1)`): the model then
    trains on cuda."""
    import torch

    if ray.get_gpu_ids() and torch.cuda.is_available() and not cfg.num_gpus:
        return cfg.model_copy(update={"num_gpus": float(len(ray.get_gpu_ids()))})
    return cfg


RANK_POLL_S = 0.5  # how often rank 0 looks at the other ranks' calls while its own runs
# test hook: "<rank>" makes that learner rank's first update fail (a rank that breaks while the others wait for it
# in a collective)
FAIL_RANK_ENV = "UNSTABLE_TEST_FAIL_LEARNER_RANK"


def _leaving_on_failure(method):
    """`method` of a learner rank, which on an exception leaves the learners' process group before raising it: the
    other ranks' collectives then fail at once instead of waiting for it until the collective timeout."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception:
            log.error("learner rank %d failed in %s: leaving the process group", self.parallel.rank, method.__name__)
            self.parallel.close()
            raise

    return wrapped


@ray.remote(**SHELL)
class LearnerRankActor(Learner):
    """Rank `rank` (> 0) of the `cfg.num_learners` data-parallel learners of the learner group
    (`topology.start_learner_group`), whose rank 0 (the `LearnerActor`) calls it together with its own learner
    (`RankZeroLearner`): it trains on its shard of each batch and saves, registers and logs nothing. Its warnings go
    to `logs/learner-<rank>.log` in the run directory of `tracker`. A call that fails leaves the process group, so
    the others fail at once (`_leaving_on_failure`)."""

    def __init__(self, cfg: LearnerConfig, model_path: str, algorithm: BaseAlgo, rank: int, tracker, dtype: str):
        _log_with(tracker, f"learner-{rank}")
        cfg = _on_given_gpus(cfg)
        policy, parallel = learner_parts(model_path, cfg, dtype=dtype, rank=rank)
        super().__init__(policy, algorithm, cfg, parallel)

    def join(self, address: str, port: int) -> None:
        """Join the learners' process group at rank 0's `address:port`."""
        self.parallel.join(address, port)

    initialize = _leaving_on_failure(Learner.initialize)
    load_state_dict = _leaving_on_failure(Learner.load_state_dict)
    save_checkpoint = _leaving_on_failure(Learner.save_checkpoint)

    @_leaving_on_failure
    def train_step(self, steps: list) -> dict[str, Any]:
        """This rank's part of the update on `steps`."""
        if os.environ.get(FAIL_RANK_ENV) == str(self.parallel.rank):
            raise RuntimeError(f"learner rank {self.parallel.rank} fails its update: {FAIL_RANK_ENV} is set")
        return super().train_step(steps)

    @_leaving_on_failure
    def state_dict(self) -> None:
        """Take part in gathering a sharded model's state onto rank 0, which keeps it; nothing comes back."""
        super().state_dict()


class RankZeroLearner(Learner):
    """Rank 0 of data-parallel learners (`parallel`), inside the `LearnerActor`: the calls every rank makes together
    (joining, `initialize` with its weight broadcast, `train_step`, `load_state_dict`, and with a sharded model
    `save_checkpoint` and `state_dict`) are sent to the other ranks' actors (`ranks`, in rank order) and then run
    here, since the collectives inside them wait for every rank."""

    def __init__(
        self, policy: PolicyModel, algorithm: BaseAlgo, cfg: LearnerConfig, parallel: DataParallel, ranks: list
    ):
        super().__init__(policy, algorithm, cfg, parallel)
        self.ranks = ranks
        address, port = ray.util.get_node_ip_address(), free_port()
        self._with_ranks("join", self.parallel.join, address, port)

    def initialize(self) -> None:
        """Initialize every rank (rank 0's weights are broadcast to the others); idempotent."""
        if self.optimizer is None:
            self._with_ranks("initialize", super().initialize)

    def train_step(self, steps: list) -> dict[str, Any]:
        """Every rank's update on its shard of `steps`; returns the metrics averaged over the ranks."""
        return self._with_ranks("train_step", super().train_step, steps)

    def save_checkpoint(self, directory: str) -> str:
        """Save the weights to `directory`; a sharded model's are gathered from every rank first."""
        if not self.parallel.sharded:
            return super().save_checkpoint(directory)
        return self._with_ranks("save_checkpoint", super().save_checkpoint, directory)

    def state_dict(self) -> dict[str, Any]:
        """The resume state; a sharded model's weights and optimizer state are gathered from every rank."""
        if not self.parallel.sharded:
            return super().state_dict()
        self.initialize()
        return self._with_ranks("state_dict", super().state_dict)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rank 0's saved `state` on every rank."""
        self.initialize()
        self._with_ranks("load_state_dict", super().load_state_dict, state)

    def _with_ranks(self, method: str, here, *args):
        """Call `method` on the other ranks' actors and `here` (rank 0's own, on a thread), with `args` put in Ray's
        object store once; returns rank 0's result once every rank finished. The other ranks are watched while
        rank 0's call runs: one that fails raises its error (the cause) at once, however long rank 0's call would
        wait for it in a collective (until the collective timeout, 30 minutes, before); the run then stops."""
        shared = [ray.put(arg) for arg in args]
        others = [getattr(rank, method).remote(*shared) for rank in self.ranks]
        own: dict[str, Any] = {}
        done = threading.Event()

        def run_here() -> None:
            try:
                own["result"] = here(*args)
            except Exception as exc:  # noqa: BLE001 - raised below, after the other ranks' cause
                own["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run_here, name=f"learner-rank-0-{method}", daemon=True).start()
        while not done.wait(RANK_POLL_S):
            if (failure := _rank_failure(others)) is not None:
                raise failure
        if "error" in own:
            raise _rank_failure(others, wait_s=10.0) or own["error"]
        ray.get(others)
        return own["result"]


def _rank_failure(calls: list, wait_s: float = 0.0) -> RuntimeError | None:
    """The error of the first of the other ranks' `calls` (rank 1, 2, ...) that failed among those ended within
    `wait_s`, None when none did."""
    ended, _ = ray.wait(calls, num_returns=len(calls), timeout=wait_s)
    for rank, call in enumerate(calls, 1):
        if call in ended:
            try:
                ray.get(call)
            except Exception as exc:  # noqa: BLE001 - returned as the cause
                cause = getattr(exc, "cause", None) or exc  # the rank's own error, not Ray's wrapper of it
                return RuntimeError(f"learner rank {rank} failed: {type(cause).__name__}: {cause}")
    return None
