"""Builds the topology in one place: every component of a run as a Ray actor, wired with proxies.

No component constructs another. `build_topology(cfg, run_dir)` creates the Tracker, StepBuffer, ModelPool,
inference servers, Collector and the learner loop as thin Ray shells around the plain classes and returns
their handles; `runtime.train.run` drives them. A second front end (the seed's Ray-actor API) reuses this.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unstable.config import RunConfig
from unstable.runtime.remote import RemoteProxy

log = logging.getLogger(__name__)


@dataclass
class Topology:
    """Handles of a running topology: Ray actors, and the proxies the driver uses to call them."""

    run_dir: Path
    tracker: Any
    step_buffer: Any
    model_pool: Any
    servers: list[Any]
    inference: Any  # InferenceClient over every server
    collector: Any
    learner: Any  # the LearnerLoop actor


def resolve_model_path(cfg: RunConfig) -> str:
    """The model directory, building the tiny test model first when the config asks for it."""
    if cfg.model.build_tiny_if_missing:
        from unstable.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(cfg.model.path))
    return cfg.model.path


def new_run_dir(path: Path) -> Path:
    """`path`, or when a run already wrote there, the first free `path-2`, `path-3`, ...: a new run never
    appends its metrics to an old run's or overwrites its checkpoints."""
    candidate, number = path, 1
    while candidate.exists() and any(candidate.iterdir()):
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    if candidate != path:
        log.warning("run dir %s holds an earlier run; this run writes to %s", path, candidate)
    return candidate


def init_ray(cfg: RunConfig) -> None:
    """Start (or join) Ray with the run's CPU budget, forwarding the environment the actors need."""
    import ray

    ray.init(
        num_cpus=cfg.run.num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
        runtime_env={"env_vars": _forwarded_env()},
    )


def build_topology(cfg: RunConfig, run_dir: Path) -> Topology:
    """Create every component as a Ray actor (Ray must be running) and wire them; returns their handles.

    The model-holding actors reserve no Ray CPU (their torch threads are `num_threads`; GPUs place them), so
    several inference actors and the learner fit on a 2-CPU machine. Calls whose result nobody needs
    (`Tracker.add_game`, `ModelPool.record_game`) are fire-and-forget.
    """
    import ray

    from unstable.buffer import StepBuffer
    from unstable.collector import Collector
    from unstable.inference import InferenceClient, InferenceServer
    from unstable.learner import Learner, PolicyModel
    from unstable.pool import ModelPool
    from unstable.runtime.loop import LearnerLoop
    from unstable.tracking import Tracker

    model_path = resolve_model_path(cfg)
    seed = cfg.run.seed
    tracker = ray.remote(Tracker).options(name="Tracker").remote(str(run_dir))
    stages = cfg.buffer.transform_stages()
    buffer = ray.remote(StepBuffer).options(name="StepBuffer").remote(cfg.buffer.max_buffer_size, **stages, seed=seed)
    pool = ray.remote(ModelPool).options(name="ModelPool").remote(cfg.pool, seed=seed)
    ray.get(pool.add_checkpoint.remote(path=cfg.learner.initial_lora_path, iteration=-1))
    inf = cfg.inference
    servers = [
        ray.remote(InferenceServer)
        .options(name=f"Inference-{i}", max_concurrency=4096, num_cpus=0, num_gpus=inf.num_gpus)
        .remote(backend_factory(cfg, model_path), inf)
        for i in range(inf.num_actors)
    ]
    ray.get([server.start.remote() for server in servers])
    inference = InferenceClient([RemoteProxy(server) for server in servers])
    pool_proxy, buffer_proxy = RemoteProxy(pool, fire_and_forget={"record_game"}), RemoteProxy(buffer)
    tracker_proxy = RemoteProxy(tracker, fire_and_forget={"add_game"})
    for source in (buffer_proxy, pool_proxy, inference):
        ray.get(tracker.add_source.remote(source))
    collector = (
        ray.remote(Collector)
        .options(name="Collector", max_concurrency=8)
        .remote(
            inference,
            pool_proxy,
            buffer_proxy,
            tracker_proxy,
            cfg.collector,
            tokenizer=_chat_tokenizer(cfg, model_path),
            seed=seed,
        )
    )
    policy = PolicyModel(model_path, cfg.learner, dtype=cfg.model.dtype, temperature=inf.temperature)
    learner = Learner(policy, cfg.learner.algorithm.build(), cfg.learner)
    loop = (
        ray.remote(LearnerLoop)
        .options(name="Learner", num_cpus=0, num_gpus=cfg.learner.num_gpus)
        .remote(learner, buffer_proxy, pool_proxy, tracker_proxy, str(run_dir))
    )
    return Topology(run_dir, tracker, buffer, pool, servers, inference, collector, loop)


def backend_factory(cfg: RunConfig, model_path: str) -> Callable:
    """A picklable zero-argument callable that builds the configured inference backend in its actor."""
    from unstable.inference import make_backend

    return functools.partial(make_backend, model_path, cfg.inference, dtype=cfg.model.dtype, seed=cfg.run.seed)


def _chat_tokenizer(cfg: RunConfig, model_path: str):
    """The tokenizer, only when a game uses the `default` (chat template) prompt."""
    envs = cfg.collector.training_envs + cfg.collector.evaluation_envs
    if not any(e.prompt_template == "default" for e in envs):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _forwarded_env() -> dict[str, str]:
    """Environment variables the actors must see (offline hub, vLLM CPU settings, thread counts)."""
    prefixes = ("HF_", "TRANSFORMERS_", "VLLM_", "OMP_", "TOKENIZERS_")
    quiet = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return quiet | {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
