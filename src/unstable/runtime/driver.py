"""Runs a built topology: evaluate, collect and learn concurrently, evaluate again; and `train`, which does it all
(after the supervised warm start, when the config has one).

`run` works on any `Topology`, so every front end (the YAML/CLI path here, the seed's Ray-actor API) drives
the same actors the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from unstable.config import RunConfig
from unstable.records import GameRecord
from unstable.runtime.topology import Topology, build_topology, init_ray, resolve_model_path
from unstable.tracking import keys, new_run_dir, wdl_summary


@dataclass
class RunSummary:
    """What a finished run reports; `eval_start`/`eval_end` are `tracking.wdl_summary` tables."""

    run_dir: str
    learner_steps: int
    train_games: int
    eval_start: dict[str, Any] = field(default_factory=dict)
    eval_end: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    warm_start_checkpoint: str | None = None


def eval_table(records: list[GameRecord]) -> dict[str, Any]:
    """The learner seat's W/D/L over finished eval games (with Wilson intervals) and the failed-game count."""
    finished = [r for r in records if not r.failed]
    summary = wdl_summary(r.outcome(r.learner_player_ids[0]) for r in finished)
    return summary | {"failed": len(records) - len(finished)}


def run(topology: Topology, cfg: RunConfig, on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> RunSummary:
    """Evaluate the initial policy, train `cfg.learner.num_steps` updates while the collector plays, stop the
    collector, evaluate the final policy. Every row goes through the Tracker into `metrics.jsonl`."""
    import ray

    start = time.time()
    t = topology
    learner_ready = t.learner.initialize.remote()
    eval_start = eval_table(ray.get(t.collector.evaluate.remote(cfg.evaluation.games_at_start)))
    ray.get(learner_ready)
    on_row(ray.get(t.tracker.log.remote({keys.STEP: 0})))  # row 0: the initial policy's evaluation
    collecting = t.collector.collect.remote(cfg.collector.num_workers, cfg.collector.num_eval_workers)
    for _ in range(cfg.learner.num_steps):
        on_row(ray.get(t.learner.train.remote(1, stop_collection=False))[0])
    ray.get(t.collector.stop.remote())
    counts = ray.get(collecting)
    eval_end = eval_table(ray.get(t.collector.evaluate.remote(cfg.evaluation.games_at_end)))
    ray.get(t.tracker.log.remote({"eval_start": eval_start, "eval_end": eval_end, "final": True}))
    ray.get(t.tracker.close.remote())
    wall = time.time() - start
    return RunSummary(str(t.run_dir), cfg.learner.num_steps, counts["train"], eval_start, eval_end, wall)


def warm_start(
    cfg: RunConfig, run_dir: Path, on_epoch: Callable[[dict[str, Any]], None] = lambda row: None
) -> RunConfig:
    """Run `cfg.warm_start`: SFT on the scripted agents' moves in the first training env, with the learner's LoRA
    shape (or every weight) and all CPU threads, into `run_dir/warm-start/`. Returns `cfg` starting RL from that
    checkpoint: the new `model.path` when fully fine-tuning, else `learner.initial_lora_path`. `on_epoch` gets
    each pass's `{"epoch", "loss", "updates", "moves"}`."""
    from transformers import AutoTokenizer

    from unstable.collector.demonstrations import generate_sft_steps
    from unstable.learner import LearnerConfig
    from unstable.learner.sft import run_sft

    ws = cfg.warm_start
    model = resolve_model_path(cfg)
    spec = cfg.collector.training_specs()[0]
    steps = generate_sft_steps(spec, ws.agents, ws.games, AutoTokenizer.from_pretrained(model), seed=cfg.run.seed)
    sft_cfg = LearnerConfig(
        batch_size=ws.batch_size,
        learning_rate=ws.learning_rate,
        micro_batch_tokens=cfg.learner.micro_batch_tokens,
        lora=cfg.learner.lora,
        num_threads=None,
    )
    checkpoint = run_sft(
        model,
        steps,
        sft_cfg,
        out_dir=str(run_dir / "warm-start"),
        epochs=ws.epochs,
        seed=cfg.run.seed,
        on_epoch=lambda row: on_epoch(row | {"moves": len(steps)}),
    )
    if cfg.learner.lora is None:
        model_cfg = cfg.model.model_copy(update={"path": checkpoint, "build_tiny_if_missing": False})
        return cfg.model_copy(update={"model": model_cfg})
    return cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"initial_lora_path": checkpoint})})


def train(
    cfg: RunConfig,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    on_warm_start_epoch: Callable[[dict[str, Any]], None] = lambda row: None,
) -> RunSummary:
    """The whole run: a fresh run directory with the config, the warm start if configured (`warm_start`), then
    the topology on Ray, `run`, and shutdown."""
    import ray

    run_dir = new_run_dir(cfg.run.path)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    start = time.time()
    warm_checkpoint = None
    if cfg.warm_start is not None:
        cfg = warm_start(cfg, run_dir, on_warm_start_epoch)
        warm_checkpoint = cfg.model.path if cfg.learner.lora is None else cfg.learner.initial_lora_path
    init_ray(cfg)
    try:
        summary = run(build_topology(cfg, run_dir), cfg, on_row)
    finally:
        ray.shutdown()
    summary.warm_start_checkpoint = warm_checkpoint
    summary.wall_seconds = time.time() - start
    return summary
