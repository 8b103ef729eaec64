"""The Tracker: collects game summaries and component metrics, writes one JSONL row per learner step."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from unstable.records import GameRecord
from unstable.tracking import keys
from unstable.tracking.stats import wdl_summary

log = logging.getLogger(__name__)


def summarize_game(record: GameRecord) -> dict[str, Any]:
    """The few numbers the tracker needs from a game (so whole records never travel to it)."""
    steps = [s for s in record.steps if s.player_id in record.learner_player_ids]
    outcome = None
    if not record.failed and record.learner_player_ids:
        outcome = record.outcome(record.learner_player_ids[0])
    return {
        "env_id": record.env_id,
        "is_eval": record.is_eval,
        "failed": record.failed,
        "error_type": record.error.split(":", 1)[0] if record.failed else None,
        "truncated": record.truncated,
        "outcome": outcome,
        "opponent": next((a for p, a in record.players.items() if p not in record.learner_player_ids), None),
        "turns": len(record.steps),
        "learner_steps": len(steps),
        "format_ok": sum(s.format_ok for s in steps),
        "invalid_moves": sum(s.invalid_move for s in steps),
        "generated_tokens": sum(len(s.completion_token_ids) for s in record.steps),
        "wall_seconds": record.wall_seconds,
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


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the rows of `path` up to and including the one of learner step `step`; returns the rows dropped.

    The rule of resume: rows after the last saved step belong to work the kill lost (the resumed run redoes
    it), and a torn last line is one of them, so the resumed run appends with no learner step twice or missing.
    With `step` -1 (no state saved) every row goes: the run starts over.
    """
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = 0
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if row.get(keys.STEP) == step:
            kept = i + 1
            break
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines[:kept]))
    os.replace(tmp, path)
    if kept < len(lines):
        log.warning("resume at learner step %d: dropped %d rows of %s written after it", step, len(lines) - kept, path)
    return len(lines) - kept


class MetricSource(Protocol):
    """A component whose gauges the Tracker reads when it writes a row (buffer, pool, inference client)."""

    def metrics(self) -> dict[str, Any]: ...


class Tracker:
    """Aggregates game summaries over a window and writes every metric to `run_dir/metrics.jsonl` (and to each
    sink in `sinks`, e.g. `tracking.sinks.WandbSink`).

    `log(metrics)` closes the window: it adds the window's collector aggregates (games/s, tokens/s, format
    and invalid-move rates, eval W/D/L) and the current `metrics()` of every source added with `add_source`
    to `metrics`, appends the row to the JSONL file and returns it. So nothing reaches a caller that the
    file does not hold.
    """

    def __init__(self, run_dir: str | os.PathLike, sinks: list[Any] | None = None):
        self.sources: list[MetricSource] = []
        self.sinks = list(sinks or [])
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self.start = time.time()
        self.totals: Counter = Counter()
        self.failed_by_cause: Counter = Counter()
        self.rows: list[dict[str, Any]] = []
        self._window_games: list[dict[str, Any]] = []
        self._window_start = time.time()

    def add_source(self, source: MetricSource) -> None:
        """Read `source.metrics()` into every row from now on."""
        self.sources.append(source)

    def add_game(self, summary: dict[str, Any]) -> None:
        """Record one finished game's summary (see `summarize_game`)."""
        self._window_games.append(summary)
        self.totals["eval_games" if summary["is_eval"] else "train_games"] += 1
        self.totals["failed_games"] += summary["failed"]
        if summary["failed"]:
            self.failed_by_cause[summary["error_type"]] += 1

    def log(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write one row: `metrics` plus the collector aggregates of the window since the last row."""
        now = time.time()
        row = {keys.TIME: now - self.start, **(metrics or {}), **self._window_aggregates(now)}
        for source in self.sources:
            row.update(source.metrics())
        row.update({f"total/{k}": v for k, v in self.totals.items()})
        row.update({keys.FAILED_BY_CAUSE + cause: n for cause, n in self.failed_by_cause.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for sink in self.sinks:
            sink.write(row)
        self.rows.append(row)
        self._window_games = []
        self._window_start = now
        return row

    def state_dict(self) -> dict[str, Any]:
        """Game totals and the run's elapsed seconds, for resume (rows themselves stay in `metrics.jsonl`)."""
        return {
            "totals": dict(self.totals),
            "failed_by_cause": dict(self.failed_by_cause),
            "elapsed": time.time() - self.start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue totals and the `time` column from `state_dict()`'s output."""
        self.totals = Counter(state["totals"])
        self.failed_by_cause = Counter(state["failed_by_cause"])
        self.start = time.time() - state["elapsed"]

    def get_run_dir(self) -> str:
        """The run directory (other actors write their checkpoints under it)."""
        return str(self.run_dir)

    def close(self) -> None:
        """Close every sink (the JSONL file needs nothing)."""
        for sink in self.sinks:
            sink.close()

    def latest(self) -> dict[str, Any]:
        """The last row written (empty before the first)."""
        return self.rows[-1] if self.rows else {}

    def _window_aggregates(self, now: float) -> dict[str, float]:
        elapsed = max(now - self._window_start, 1e-9)
        train = [g for g in self._window_games if not g["is_eval"] and not g["failed"]]
        evals = wdl_summary(g["outcome"] for g in self._window_games if g["is_eval"] and g["outcome"] is not None)
        decisions = sum(g["learner_steps"] for g in train)
        return {
            "collector/games_per_s": len(train) / elapsed,
            "collector/tokens_per_s": sum(g["generated_tokens"] for g in self._window_games) / elapsed,
            "collector/train_games": len(train),
            "collector/failed_games": sum(g["failed"] for g in self._window_games),
            "collector/mean_turns": sum(g["turns"] for g in train) / max(len(train), 1),
            "collector/format_ok_rate": sum(g["format_ok"] for g in train) / max(decisions, 1),
            "collector/invalid_move_rate": sum(g["invalid_moves"] for g in train) / max(decisions, 1),
            "eval/games": evals["games"],
            "eval/win_rate": evals["win_rate"],
            "eval/draw_rate": evals["draw_rate"],
            "eval/loss_rate": evals["loss_rate"],
            "eval/win_low": evals["win_ci"][0],
            "eval/win_high": evals["win_ci"][1],
        }
