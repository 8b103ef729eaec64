"""Builds the topology of a run: every component as a Ray actor, each given its config section whole.

No component constructs another. `build_topology(cfg, run_dir)` starts the shells of `runtime.actors` as peers
(tracker, buffer, pool, the inference group, collector, the learner group) and returns their handles;
`runtime.driver.run` drives them. The original API's actor classes (`runtime.original_api`) start the inference and
learner groups through the same `launch_inference_group` (then `await_inference_group`) and `start_learner_group`.

On a Ray cluster every actor that writes the run directory (Tracker, StepBuffer, ModelPool, Collector and the
learner, which all log there, the learner also saving checkpoints and states) runs on the driver's node; only the
inference actors go elsewhere (`inference.resources` says where). Checkpoints reach them through Ray's object store
unless `run.shared_storage` says every node sees the run directory.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unstable.collector.config import MAX_GAMES_IN_FLIGHT
from unstable.config import ConfigError, RunConfig
from unstable.inference.config import InferenceConfig

if TYPE_CHECKING:
    from unstable.algorithms.base import BaseAlgo
    from unstable.learner import LearnerConfig
    from unstable.runtime.actors import InferenceGroup

log = logging.getLogger(__name__)


@dataclass
class Topology:
    """Handles of a running topology's Ray actors."""

    run_dir: Path
    tracker: Any
    step_buffer: Any
    model_pool: Any
    inference: InferenceGroup  # the inference server actors, handed to the collector and the learner
    collector: Any
    learner: Any  # the learner loop


def resolve_model_path(cfg: RunConfig) -> str:
    """The model directory, building the tiny test model first (named absolutely) when the config asks for it."""
    if cfg.model.build_tiny_if_missing:
        from unstable.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(cfg.model.path, cfg.model.tiny_shape).resolve())
    return cfg.model.path


# Ray waits a fixed 30 s for a new node to register with its GCS, then raises this; on a loaded machine (a 2-core
# VM at load average 20) that happens to one start in a few, and the next try usually starts.
NODE_START_TIMED_OUT = "node timed out during startup"
RAY_START_ATTEMPTS = 3


def init_ray(cfg: RunConfig) -> None:
    """Start (or join) Ray with the run's CPU budget, forwarding the environment the actors need; a node that
    times out at startup is started again, up to `RAY_START_ATTEMPTS` tries."""
    import ray

    # Ray prestarts a worker process per CPU when the first driver connects; none can host this run's actors (they
    # lack its runtime env), so each only costs a second of CPU at every start. A cluster already running keeps its own.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(
                num_cpus=cfg.run.num_cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
                ignore_reinit_error=True,
                runtime_env={"env_vars": _forwarded_env()},
            )
            return
        except Exception as exc:
            if NODE_START_TIMED_OUT not in str(exc):
                raise
            ray.shutdown()
            if attempt == RAY_START_ATTEMPTS:
                raise RuntimeError(f"Ray did not start in {RAY_START_ATTEMPTS} attempts: {exc}") from exc
            log.warning(
                "Ray's node timed out at startup (attempt %d of %d): starting it again", attempt, RAY_START_ATTEMPTS
            )


def build_topology(cfg: RunConfig, run_dir: Path, resume_step: int = 0) -> Topology:
    """Create every component as a Ray actor (Ray must be running) and wire them; returns their handles.

    The tracker, buffer, pool, inference group, collector and learner are peers, each given its config section
    whole; the inference group's handles go to the collector and the learner. A run resumed from learner step
    `resume_step` gives its collector and inference actors that step, so they draw seeds that no earlier session
    of the run used.
    """
    import ray

    from unstable.runtime.actors import CollectorActor, ModelPoolActor, StepBufferActor, TrackerActor, on_node

    model_path = resolve_model_path(cfg)
    seed = cfg.run.seed
    driver_node = ray.get_runtime_context().get_node_id()
    others = _other_nodes(cfg, driver_node)
    _check_model_on(others, model_path)
    placements = learner_placements(cfg.learner, driver_node)  # refused before any actor starts
    here = on_node(driver_node)
    tracker = TrackerActor.options(name="Tracker", scheduling_strategy=here).remote(
        cfg.tracker, str(run_dir.resolve()), cfg.run.name
    )
    buffer = StepBufferActor.options(name="StepBuffer", scheduling_strategy=here).remote(cfg.buffer, tracker, seed=seed)
    pool = ModelPoolActor.options(name="ModelPool", scheduling_strategy=here).remote(cfg.pool, tracker, seed=seed)
    ray.get(pool.add_checkpoint.remote(path=cfg.learner.policy.initial_lora_path, iteration=-1))
    inference, engines_starting = launch_inference_group(
        cfg.inference,
        model_path,
        dtype=cfg.model.dtype,
        seed=seed,
        resume_step=resume_step,
        lora_rank=cfg.served_lora_rank,
        requests_in_flight=cfg.collector.requests_in_flight(),
        checkpoint_node=None if cfg.run.shared_storage or not others else driver_node,
    )
    collector = CollectorActor.options(name="Collector", scheduling_strategy=here).remote(
        cfg.collector, inference, buffer, pool, tracker, seed=seed, resume_step=resume_step
    )
    learner = start_learner_group(
        cfg.learner,
        model_path,
        buffer,
        pool,
        tracker,
        cfg.learner.algorithm.build(),
        placements=[placements[0] | {"name": "Learner"}, *placements[1:]],
        dtype=cfg.model.dtype,
        inference_servers=inference.servers,
    )
    await_inference_group(inference, engines_starting)  # the learner's process started beside the engines
    return Topology(run_dir, tracker, buffer, pool, inference, collector, learner)


def launch_inference_group(
    inference: InferenceConfig,
    model_path: str,
    *,
    dtype: str = "float32",
    seed: int = 0,
    resume_step: int = 0,
    lora_rank: int | None = None,
    requests_in_flight: int = MAX_GAMES_IN_FLIGHT,
    checkpoint_node: str | None = None,
) -> tuple[InferenceGroup, list]:
    """The inference group of a run, its engines starting: `inference.num_actors` inference server actors of the
    base model at `model_path` (weights in `dtype`), serving adapters up to `lora_rank`. The YAML path's builder
    starts its own here and its learner beside them; the original API's Collector waits for its engines at once.
    Each actor samples with its own seed, mixed from the run's `seed`, its index and `resume_step` (0 for a fresh
    run): no two actors, nor two sessions of a resumed run, share a stream.
    The seeds are logged. Each actor gets a Ray thread per request the collector may have in flight
    (`requests_in_flight`: `CollectorConfig.requests_in_flight`, vines included) and `CONTROL_CALLS` more: Ray makes
    every thread of a threaded actor, and over a long run each one is used and its stack touched (4,096 threads grew
    the soak's inference actor by ~0.1 MB per learner step). Each actor needs `inference.resources` besides its GPUs;
    one placed on another node than `checkpoint_node` gets the checkpoints from a `CheckpointSource` started there.
    Returns the group and the calls that start its engines, for `await_inference_group`; too few GPUs in the cluster
    raise a ConfigError of one line."""
    import ray

    from unstable.inference import make_backend
    from unstable.records import mixed_seed
    from unstable.runtime.actors import (
        CONTROL_CALLS,
        CheckpointSource,
        InferenceGroup,
        InferenceServerActor,
        on_node,
    )

    needed, have = inference.num_gpus * inference.num_actors, ray.cluster_resources().get("GPU", 0.0)
    if needed > have:
        raise ConfigError(
            f"inference.num_actors = {inference.num_actors} x inference.num_gpus = {inference.num_gpus}: {needed} "
            f"GPUs, but the Ray cluster has {have}"
        )
    factory = functools.partial(make_backend, model_path, inference, dtype=dtype, lora_rank=lora_rank)
    seeds = [mixed_seed(seed, index, resume_step) for index in range(inference.num_actors)]
    log.info("inference actors sample with seeds %s (run seed %d, resume step %d)", seeds, seed, resume_step)
    source = None
    if checkpoint_node is not None:
        source = CheckpointSource.options(scheduling_strategy=on_node(checkpoint_node)).remote()
    servers = [
        InferenceServerActor.options(
            num_gpus=inference.num_gpus,
            resources=inference.resources,
            max_restarts=inference.max_restarts,
            max_concurrency=requests_in_flight + CONTROL_CALLS,
        ).remote(factory, inference, actor_seed, checkpoint_node, source)
        for actor_seed in seeds
    ]
    return InferenceGroup(servers, inference, model_path), [server.start.remote() for server in servers]


def await_inference_group(group: InferenceGroup, starting: list) -> InferenceGroup:
    """Wait for `starting`, the calls that start the engines of `group` (`launch_inference_group`), and return the
    group; an engine that does not start raises a ConfigError of one line."""
    import ray

    try:
        for server, call in zip(group.servers, starting):
            _start_surviving_restarts(server, call, group.cfg.max_restarts)
    except ray.exceptions.RayError as exc:  # one line for the user: the engine's own first words, not Ray's trace
        cause = getattr(exc, "cause", None) or exc
        raise ConfigError(
            f"inference.backend = {group.cfg.backend}: the inference engine did not start: {_first_line(cause)}"
        ) from exc
    return group


ENGINE_START_S = 1800.0  # the longest an inference actor may take to start, restarts included


def _start_surviving_restarts(server, call, max_restarts: int) -> None:
    """Wait for `call`, the inference actor `server`'s `start`. An actor whose process died while starting (killed,
    not refused by its engine) is restarted by Ray up to `max_restarts` times: start it again (`start` is idempotent;
    a restarted actor starts itself) instead of failing the run's start."""
    import ray

    deaths, deadline = 0, time.monotonic() + ENGINE_START_S
    while True:
        try:
            return ray.get(call)
        except ray.exceptions.ActorUnavailableError:  # restarting now: ask again in a moment
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
        except ray.exceptions.RayActorError:  # its process died
            deaths += 1
            if deaths > max_restarts:
                raise
        call = server.start.remote()


def _first_line(exc: BaseException) -> str:
    """`exc`'s type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _other_nodes(cfg: RunConfig, driver_node: str) -> list[dict[str, Any]]:
    """The live Ray nodes besides the driver's that can host an inference actor (they have `inference.resources`;
    `ray.nodes()` entries)."""
    import ray

    def can_host(node: dict[str, Any]) -> bool:
        return all(node["Resources"].get(name, 0) >= amount for name, amount in cfg.inference.resources.items())

    return [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != driver_node and can_host(n)]


def _check_model_on(nodes: list[dict[str, Any]], model_path: str) -> None:
    """Refuse, in one line, a base model that one of `nodes` lacks at `model_path` (an inference actor there would
    fail to load it); the driver's own node was checked with the config."""
    import ray

    from unstable.runtime.actors import model_problem, on_node

    problems = ray.get(
        [model_problem.options(scheduling_strategy=on_node(n["NodeID"])).remote(model_path) for n in nodes]
    )
    for node, problem in zip(nodes, problems):
        if problem is not None:
            raise ConfigError(
                f"model.path = {model_path!r}: {problem} on Ray node {node['NodeManagerAddress']} "
                f"({node['NodeID'][:8]}); every node that may run an inference actor needs the base model at the same "
                "path (or give a hub id)"
            )


def learner_placements(cfg: LearnerConfig, driver_node: str) -> list[dict[str, Any]]:
    """The Ray options of each of the `cfg.num_learners` learner ranks, rank 0's first. Rank 0 runs on the driver's
    node (it writes the run directory). With GPUs the ranks are one placement group, a bundle of `cfg.num_gpus` each:
    rank 0's bundle on the driver's node, the others packed onto as few nodes as possible (PACK), so each learner
    stays with its GPUs, the ranks sit together where they fit, and they are reserved all at once or not at all.
    Learners without GPUs: the other ranks anywhere. Refused (ConfigError) when the cluster cannot hold them."""
    import ray
    from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from unstable.runtime.actors import on_node

    gpus, ranks = cfg.num_gpus, cfg.num_learners
    if not gpus:
        return [{"num_gpus": 0, "scheduling_strategy": on_node(driver_node)}] + [{"num_gpus": 0}] * (ranks - 1)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    have = next(n["Resources"].get("GPU", 0) for n in nodes if n["NodeID"] == driver_node)
    if gpus > have:
        raise ConfigError(
            f"learner.num_gpus = {gpus}: the learner runs on the driver's node (it writes the run directory), "
            f"which has {have} GPUs"
        )
    fits = sum(int(n["Resources"].get("GPU", 0) // gpus) for n in nodes)
    if ranks > fits:
        raise ConfigError(
            f"learner.num_learners = {ranks} with learner.num_gpus = {gpus} each: the Ray cluster's nodes hold "
            f"{fits} such learners"
        )
    group = placement_group(
        [{"GPU": gpus}] * ranks,
        strategy="PACK",
        bundle_label_selector=[{NODE_ID_LABEL_KEY: driver_node}] + [{}] * (ranks - 1),
    )
    return [
        {
            "num_gpus": gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
        }
        for rank in range(ranks)
    ]


def start_learner_group(
    cfg: LearnerConfig,
    model_path: str,
    step_buffer,
    model_pool,
    tracker,
    algorithm: BaseAlgo,
    *,
    placements: list[dict[str, Any]],
    dtype: str = "float32",
    inference_servers: list | None = None,
) -> Any:
    """The learner group: one actor per learner rank, each under its Ray options in `placements` (rank 0's first;
    one per rank), all training the base model at `model_path` (weights in `dtype`) with `algorithm` under `cfg`.
    The other ranks (`LearnerRankActor`s) start first and rank 0 (the `LearnerActor`, the loop, which joins them in
    one process group) gets their handles; returns rank 0's. The YAML path's builder and the original API's
    StandardLearner both start theirs here. `inference_servers`: see `LearnerActor`."""
    from unstable.runtime.learner_actors import LearnerActor, LearnerRankActor

    ranks = [
        LearnerRankActor.options(**options).remote(cfg, model_path, algorithm, rank, tracker, dtype)
        for rank, options in enumerate(placements[1:], 1)
    ]
    return LearnerActor.options(**placements[0]).remote(
        cfg,
        model_path,
        step_buffer,
        model_pool,
        tracker,
        algorithm,
        dtype=dtype,
        inference_servers=inference_servers,
        ranks=ranks,
    )


def _forwarded_env() -> dict[str, str]:
    """Environment variables the actors must see (offline hub, vLLM CPU settings, thread counts, the API
    opponents' endpoint, W&B mode). Secrets (names with KEY, TOKEN or SECRET) are never put in Ray's runtime
    env, which Ray records: local workers inherit them from this process, a cluster's nodes need them set."""
    prefixes = ("HF_", "TRANSFORMERS_", "VLLM_", "OMP_", "TOKENIZERS_", "UNSTABLE_", "WANDB_")
    quiet = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    secret = ("KEY", "TOKEN", "SECRET")
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(prefixes) and not any(s in k for s in secret)}
    return quiet | forwarded
