"""The Ray actors: thin shells around the plain components, each taking its component's settings section whole.

This is the one place where the components become Ray actors. `runtime.topology` starts them, as peers, for both
front ends: the YAML/CLI path (`build_topology`) and the original API (`runtime.original_api`, which translates its
keywords into the same sections). Each shell subclasses its plain class, so every method of the component is an
actor method; other actors' handles are wrapped in `RemoteProxy` so the plain code calls them like local objects.
Shells reserve no Ray CPU (their work is waiting or is placed by GPUs), so a whole run fits on a 2-CPU machine.

The learner's actors, which hold a model and torch, are in `runtime.learner_actors`: a Ray worker imports the module
of the class it hosts, so a tracker, a buffer, a pool or a collector does not load torch.

Across nodes: the actors that write the run directory run on the driver's node (`runtime.topology`); an inference
actor on another node gets the checkpoints written there through Ray's object store (`CheckpointSource`).
"""

from __future__ import annotations

import functools
import logging
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig, RewardStages
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.config.schema import check_model_path
from unstable.inference import InferenceClient, InferenceConfig, InferenceServer
from unstable.inference.checkpoints import CheckpointCache, CheckpointFiles
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import mixed_seed
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
    """A run's inference server actors (`topology.launch_inference_group`), serving the base model at
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
    `topology.launch_inference_group`). A restarted one loads its engine again at once, with `seed` mixed with a
    fresh restart nonce so it does not replay the stream its dead process began. Meanwhile the collector's
    `InferenceClient` sends its requests to the other actors (`_actor_gone`); with none, the games waiting on it fail
    (counted in `collector/failed_games` and by cause) and the collector starts new games in their place.

    An actor on another node than `checkpoint_node` (the node whose disk holds the checkpoints; None: every node
    sees them) loads every checkpoint from a node-local cache, fetched from `source` (a `CheckpointSource` there).
    """

    def __init__(
        self, backend_factory, cfg: InferenceConfig, seed: int = 0, checkpoint_node: str | None = None, source=None
    ):
        restarted = _was_restarted()
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


def _was_restarted() -> bool:
    """Whether Ray restarted this actor after its process died. Ray's own property reads its deprecated `actor_id`
    and would print a deprecation warning into every run's output; that warning is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ray.get_runtime_context().was_current_actor_reconstructed


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


def _chat_tokenizer(cfg: CollectorConfig, model_path: str):
    """The tokenizer, only when a game uses the `default` (chat template) prompt."""
    if not any(e.prompt_template == "default" for e in cfg.training_envs + cfg.evaluation_envs):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
