"""Wires the topology in one place: builds every component from a RunConfig and runs training on Ray.

No component constructs another: this module creates the Tracker, StepBuffer, ModelPool, inference server,
Collector and StandardLearner as Ray actors and hands each the proxies it needs.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from unstable.config.schema import RunConfig
from unstable.evaluation.stats import wilson_interval
from unstable.records import GameRecord

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What a finished run reports."""

    run_dir: str
    learner_steps: int
    train_games: int
    eval_start: dict[str, float] = field(default_factory=dict)
    eval_end: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0


def resolve_model_path(cfg: RunConfig) -> str:
    """The model directory, building the tiny test model first when the config asks for it."""
    if cfg.model.build_tiny_if_missing:
        from unstable.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(cfg.model.path))
    return cfg.model.path


def build_transforms(cfg: RunConfig) -> dict[str, Any]:
    """The StepBuffer's three reward-transform stages from the config."""
    from unstable.rewards import (
        ComposeFinalRewardTransforms,
        ComposeSamplingRewardTransforms,
        ComposeStepRewardTransforms,
        build_transform,
    )

    def stage(items, compose):
        return compose([build_transform(t.name, t.args) for t in items]) if items else None

    return {
        "final_reward_transformation": stage(cfg.buffer.final_reward_transforms, ComposeFinalRewardTransforms),
        "step_reward_transformation": stage(cfg.buffer.step_reward_transforms, ComposeStepRewardTransforms),
        "sampling_reward_transformation": stage(cfg.buffer.sampling_reward_transforms, ComposeSamplingRewardTransforms),
    }


def backend_factory(cfg: RunConfig, model_path: str) -> Callable:
    """A picklable zero-argument callable that builds the configured inference backend."""
    from unstable.inference import SamplingConfig, make_backend

    inf = cfg.inference
    sampling = SamplingConfig(inf.max_new_tokens, inf.temperature, inf.top_p)
    engine = {"gpu_memory_utilization": inf.gpu_memory_utilization} if inf.backend == "vllm" else {}
    return functools.partial(
        make_backend,
        inf.backend,
        model_path,
        sampling,
        dtype=cfg.model.dtype,
        max_model_len=inf.max_model_len,
        max_loras=inf.max_loras,
        num_threads=inf.num_threads,
        seed=cfg.run.seed,
        **engine,
    )


def outcome_table(records: list[GameRecord]) -> dict[str, float]:
    """W/D/L rates of the learner's seat over finished eval games, with a 95% Wilson interval on wins."""
    finished = [r for r in records if not r.failed]
    outcomes = [r.outcome(r.learner_player_ids[0]) for r in finished]
    n = len(outcomes)
    wins = outcomes.count("win")
    low, high = wilson_interval(wins, n)
    return {
        "games": n,
        "failed": len(records) - n,
        "win": wins / max(n, 1),
        "draw": outcomes.count("draw") / max(n, 1),
        "loss": outcomes.count("loss") / max(n, 1),
        "win_low": low,
        "win_high": high,
    }


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


def train(cfg: RunConfig, on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> RunSummary:
    """Run the whole loop on Ray: evaluate, collect and learn concurrently, evaluate again, shut down."""
    import ray

    from unstable.agents.scripted import make_scripted_agent  # noqa: F401  (fail early if missing)
    from unstable.algorithms import ALGORITHMS
    from unstable.buffer import StepBuffer
    from unstable.collector import Collector
    from unstable.distributed import RemoteProxy
    from unstable.inference import InferenceClient, InferenceServer
    from unstable.learner import StandardLearner
    from unstable.pool import ModelPool
    from unstable.tracking import Tracker

    start = time.time()
    run_dir = new_run_dir(cfg.run.path)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    model_path = resolve_model_path(cfg)

    ray.init(
        num_cpus=cfg.run.num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
        runtime_env={"env_vars": _forwarded_env()},
    )
    try:
        tracker = ray.remote(Tracker).options(name="Tracker").remote(str(run_dir))
        buffer = (
            ray.remote(StepBuffer)
            .options(name="StepBuffer")
            .remote(max_buffer_size=cfg.buffer.max_buffer_size, seed=cfg.run.seed, **build_transforms(cfg))
        )
        pool = (
            ray.remote(ModelPool)
            .options(name="ModelPool")
            .remote(
                sample_mode=cfg.pool.sample_mode,
                fixed_opponents=cfg.pool.fixed_opponents,
                max_active_lora=cfg.pool.max_active_lora,
                rating_backend=cfg.pool.rating_backend,
                seed=cfg.run.seed,
            )
        )
        ray.get(pool.add_checkpoint.remote(path=cfg.learner.initial_lora_path, iteration=-1))
        # the model-holding actors reserve no Ray CPU (their torch threads are `num_threads`; GPUs place them),
        # so several inference actors and the learner fit on a 2-CPU machine
        servers = [
            ray.remote(InferenceServer)
            .options(name=f"Inference-{i}", max_concurrency=4096, num_cpus=0, num_gpus=cfg.inference.num_gpus)
            .remote(
                backend_factory(cfg, model_path),
                max_batch_size=cfg.inference.max_batch_size,
                batch_wait_ms=cfg.inference.batch_wait_ms,
                max_loras=cfg.inference.max_loras,
            )
            for i in range(cfg.inference.num_actors)
        ]
        ray.get([server.start.remote() for server in servers])
        inference = InferenceClient([RemoteProxy(server) for server in servers])
        # ratings and game summaries are fire-and-forget from the game threads; the rest block for results
        pool_proxy, buffer_proxy = RemoteProxy(pool, fire_and_forget={"record_game"}), RemoteProxy(buffer)
        tracker_proxy = RemoteProxy(tracker, fire_and_forget={"add_game"})
        collector = (
            ray.remote(Collector)
            .options(name="Collector", max_concurrency=8)
            .remote(
                inference,
                pool_proxy,
                buffer_proxy,
                tracker_proxy,
                training_envs=[e.to_spec() for e in cfg.collector.training_envs],
                evaluation_envs=[e.to_spec() for e in cfg.collector.evaluation_envs],
                evaluation_opponent=cfg.collector.evaluation_opponent,
                tokenizer=_chat_tokenizer(cfg, model_path),
                max_turns=cfg.collector.max_turns,
                seed=cfg.run.seed,
                group_size=cfg.collector.group_size,
            )
        )
        learner_cfg = cfg.learner
        algorithm = ALGORITHMS[learner_cfg.algorithm.name](**learner_cfg.algorithm.args)
        learner = (
            ray.remote(StandardLearner)
            .options(name="Learner", num_cpus=0, num_gpus=learner_cfg.num_gpus)
            .remote(
                model_path,
                buffer_proxy,
                pool_proxy,
                tracker_proxy,
                algorithm,
                run_dir=str(run_dir),
                batch_size=learner_cfg.batch_size,
                mini_batch_size=learner_cfg.mini_batch_size,
                micro_batch_tokens=learner_cfg.micro_batch_tokens,
                learning_rate=learner_cfg.learning_rate,
                grad_clip=learner_cfg.grad_clip,
                lora_cfg=learner_cfg.lora.model_dump() if learner_cfg.lora else None,
                full_finetune=learner_cfg.lora is None,
                initial_lora_path=learner_cfg.initial_lora_path,
                max_train_len=learner_cfg.max_train_len,
                temperature=cfg.inference.temperature or 1.0,
                dtype=cfg.model.dtype,
                num_threads=learner_cfg.num_threads,
                device="cuda" if learner_cfg.num_gpus else "cpu",
                max_staleness=learner_cfg.max_staleness,
            )
        )
        learner_ready = learner.initialize.remote()

        eval_start = outcome_table(ray.get(collector.evaluate.remote(cfg.evaluation.games_at_start)))
        ray.get(learner_ready)
        on_row(ray.get(tracker.log.remote({"learner/step": 0})))  # row 0: the initial policy's evaluation
        collecting = collector.collect.remote(cfg.collector.num_workers, cfg.collector.num_eval_workers)
        for _ in range(learner_cfg.num_steps):
            row = ray.get(learner.train.remote(1))[0]
            row.update(inference.stats())
            on_row(row)
        ray.get(collector.stop.remote())
        counts = ray.get(collecting)
        eval_end = outcome_table(ray.get(collector.evaluate.remote(cfg.evaluation.games_at_end)))
        ray.get(tracker.log.remote({"eval_start": eval_start, "eval_end": eval_end, "final": True}))
        return RunSummary(
            str(run_dir), learner_cfg.num_steps, counts["train"], eval_start, eval_end, time.time() - start
        )
    finally:
        ray.shutdown()


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
