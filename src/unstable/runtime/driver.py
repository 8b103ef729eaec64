"""Runs a built topology: evaluate, collect and learn concurrently, evaluate again; and `train`, which does it all.

`run` works on any `Topology`, so every front end (the YAML/CLI path here, the seed's Ray-actor API) drives
the same actors the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from unstable.config import RunConfig
from unstable.records import GameRecord
from unstable.runtime.topology import Topology, build_topology, init_ray
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


def train(cfg: RunConfig, on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> RunSummary:
    """The whole run on Ray: a fresh run directory with the config, the topology, `run`, then shutdown."""
    import ray

    run_dir = new_run_dir(cfg.run.path)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    init_ray(cfg)
    try:
        return run(build_topology(cfg, run_dir), cfg, on_row)
    finally:
        ray.shutdown()
