"""The Tracker: collects game summaries and component metrics, writes one JSONL row per learner step."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from unstable import atomic
from unstable.records import GameRecord
from unstable.tracking import keys
from unstable.tracking.config import TrackerConfig
from unstable.tracking.history import LATEST_TABLES_FILE, METRICS_FILE, TABLES_FILE
from unstable.tracking.stats import wdl_summary

log = logging.getLogger(__name__)


def summarize_game(record: GameRecord, continuations: Sequence[GameRecord] = ()) -> dict[str, Any]:
    """The few numbers the tracker needs from a game (so whole records never travel to it); the tokens its
    `continuations` (branches, vines) generated count as the game's."""
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
        "generated_tokens": sum(len(s.completion_token_ids) for r in (record, *continuations) for s in r.steps),
        "wall_seconds": record.wall_seconds,
        "moves": [s.action for s in steps if s.format_ok and not s.invalid_move],
    }


def entropy_bits(items: Iterable[Any]) -> float:
    """Shannon entropy in bits of the empirical distribution of `items` (0.0 when there are none)."""
    counts = Counter(items)
    total = sum(counts.values())
    return -sum(n / total * math.log2(n / total) for n in counts.values()) if total else 0.0


def cannot_make(path: Path) -> str | None:
    """Why directory `path` could not be made (its nearest existing ancestor, or itself, is a file, a directory this
    process may not write into, or one that takes no new directory, as /proc), or None when it can be. Nothing is
    left behind to find out (a probe directory is made in the nearest existing ancestor and removed)."""
    existing = Path(path).absolute()
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".unstable-probe-", dir=existing))
    except OSError as exc:
        return f"{existing} takes no new directory ({exc.strerror})"
    return None


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
    """Keep the rows of `path` (`metrics.jsonl`, `tables.jsonl`) up to and including the last one of a learner step
    up to `step`; returns the rows dropped.

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
        if keys.STEP in row and row[keys.STEP] > step:
            break
        if keys.STEP in row:
            kept = i + 1
    atomic.write_text(path, "".join(line + "\n" for line in lines[:kept]))
    if kept < len(lines):
        log.warning("resume at learner step %d: dropped %d rows of %s written after it", step, len(lines) - kept, path)
    return len(lines) - kept


def wdl_by_opponent(games: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Games and W/D/L rates of the learner against each opponent in `games` (summaries; those without an
    opponent, mirror self-play, left out)."""
    outcomes: dict[str, list[str]] = {}
    for game in games:
        if game["opponent"] is not None and game["outcome"] is not None:
            outcomes.setdefault(game["opponent"], []).append(game["outcome"])
    columns = ("games", "win_rate", "draw_rate", "loss_rate")
    return {
        opponent: {column: wdl_summary(results)[column] for column in columns} for opponent, results in outcomes.items()
    }


class MetricSource(Protocol):
    """A component whose gauges the Tracker reads when it writes a row (buffer, pool, inference client)."""

    def metrics(self) -> dict[str, Any]: ...


class Tracker:
    """Aggregates game summaries and writes every metric to `run_dir/metrics.jsonl` (and to each sink in
    `sinks`, see `tracking.sinks.make_sinks`).

    `log(metrics)` writes a row: `metrics`, the collector's counts and throughput since the previous row, its
    rates over the rolling window of the last `cfg.window_games` training games (format, invalid moves, game
    length, time per turn, action entropy, W/D/L per opponent), the eval W/D/L over the last `cfg.window_games`
    eval games, and the current `metrics()` of every source added with `add_source`. It returns the row, so
    nothing reaches a caller that the file does not hold.
    """

    def __init__(self, run_dir: str | os.PathLike, sinks: list[Any] | None = None, cfg: TrackerConfig | None = None):
        self.cfg = cfg or TrackerConfig()
        self.sources: list[MetricSource] = []
        self.sinks = list(sinks or [])
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.start = time.time()
        self.totals: Counter = Counter()
        self.failed_by_cause: Counter = Counter()
        self._latest: dict[str, Any] = {}
        self._row_games: list[dict[str, Any]] = []
        self._row_start = time.time()
        self._train_window: deque[dict[str, Any]] = deque(maxlen=self.cfg.window_games)
        self._eval_window: deque[dict[str, Any]] = deque(maxlen=self.cfg.window_games)

    def add_source(self, source: MetricSource) -> None:
        """Read `source.metrics()` into every row from now on."""
        self.sources.append(source)

    def add_game(self, summary: dict[str, Any]) -> None:
        """Record one finished game's summary (see `summarize_game`)."""
        self._row_games.append(summary)
        self.totals[keys.TOTAL_EVAL_GAMES if summary["is_eval"] else keys.TOTAL_TRAIN_GAMES] += 1
        self.totals[keys.TOTAL_FAILED_GAMES] += summary["failed"]
        if summary["failed"]:
            self.failed_by_cause[summary["error_type"]] += 1
            return
        if not summary["is_eval"]:
            self._train_window.append(summary)
        elif summary["outcome"] is not None:
            self._eval_window.append(summary)

    def _source_metrics(self, source: MetricSource) -> dict[str, Any]:
        """`source.metrics()`, or nothing (with a warning) when the source fails: a part of the run that died (the
        collector, holding the inference client) must not keep the learner's step from its row."""
        try:
            return source.metrics()
        except Exception as exc:  # noqa: BLE001 - a row without that source's gauges, said in the log
            log.warning("a metric source failed, its gauges are left out of this row: %r", exc)
            return {}

    def log(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write one row: `metrics` plus the collector and eval aggregates (see the class docstring)."""
        now = time.time()
        row = {keys.TIME: now - self.start, **(metrics or {}), **self._row_aggregates(now)}
        row |= self._train_rates() | self._eval_rates()
        for source in self.sources:
            row.update(self._source_metrics(source))
        row.update(self.totals)
        row.update({keys.FAILED_BY_CAUSE + cause: n for cause, n in self.failed_by_cause.items()})
        self._write_tables(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for sink in self.sinks:
            sink.write(row)
        self._latest = row
        self._row_games = []
        self._row_start = now
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
        return self._latest

    def _write_tables(self, row: dict[str, Any]) -> None:
        """Move the row's tables (`keys.TABLES`) to `tables.json`, and every `cfg.tables_every` learner steps also to
        `tables.jsonl`: they grow with the run, the row keeps one size. Written before the row, so a reader that
        sees the row finds its tables."""
        tables = {key: row.pop(key) for key in keys.TABLES if key in row}
        if not tables:
            return
        step = row.get(keys.STEP)
        tables = ({keys.STEP: step} if step is not None else {}) | tables
        if step is not None and step % self.cfg.tables_every == 0:
            with open(self.run_dir / TABLES_FILE, "a") as f:
                f.write(json.dumps(tables) + "\n")
        atomic.write_json(self.run_dir / LATEST_TABLES_FILE, tables)

    def _row_aggregates(self, now: float) -> dict[str, float]:
        """Counts and throughput of the games finished since the previous row."""
        elapsed = max(now - self._row_start, 1e-9)
        train = [g for g in self._row_games if not g["is_eval"] and not g["failed"]]
        return {
            keys.GAMES_PER_S: len(train) / elapsed,
            keys.GAME_TOKENS_PER_S: sum(g["generated_tokens"] for g in self._row_games) / elapsed,
            keys.GAME_TOKENS: sum(g["generated_tokens"] for g in self._row_games),
            keys.TRAIN_GAMES: len(train),
            keys.FAILED_GAMES: sum(g["failed"] for g in self._row_games),
        }

    def _train_rates(self) -> dict[str, float]:
        """Rates over the rolling window of training games."""
        games = self._train_window
        n = max(len(games), 1)
        turns = sum(g["turns"] for g in games)
        decisions = max(sum(g["learner_steps"] for g in games), 1)
        moves = [move for g in games for move in g["moves"]]
        return {
            keys.MEAN_TURNS: turns / n,
            keys.MEAN_GAME_SECONDS: sum(g["wall_seconds"] for g in games) / n,
            keys.SECONDS_PER_TURN: sum(g["wall_seconds"] for g in games) / max(turns, 1),
            keys.FORMAT_OK_RATE: sum(g["format_ok"] for g in games) / decisions,
            keys.INVALID_MOVE_RATE: sum(g["invalid_moves"] for g in games) / decisions,
            keys.ACTION_ENTROPY: entropy_bits(moves),
            keys.DISTINCT_ACTIONS: len(set(moves)),
            keys.TRAIN_WDL_BY_OPPONENT: wdl_by_opponent(games),
        }

    def _eval_rates(self) -> dict[str, float]:
        """W/D/L of the learner over the rolling window of eval games, with the win rate's Wilson interval."""
        evals = wdl_summary(g["outcome"] for g in self._eval_window)
        return {
            keys.EVAL_GAMES: evals["games"],
            keys.EVAL_WIN_RATE: evals["win_rate"],
            keys.EVAL_DRAW_RATE: evals["draw_rate"],
            keys.EVAL_LOSS_RATE: evals["loss_rate"],
            keys.EVAL_WIN_LOW: evals["win_ci"][0],
            keys.EVAL_WIN_HIGH: evals["win_ci"][1],
        }
