"""Reading a run back from its `metrics.jsonl`: every row, the rows appended since the last look, and one
metric's values over learner steps. The dashboard and the report read runs only through these.

The tables that grow with the run (`keys.TABLES`: the ladder, the match matrix) live beside the rows:
`tables.jsonl` holds them every `tracker.tables_every` learner steps and `tables.json` the newest; reading merges
each into the row of its step, so a row read back holds its tables where they were written (older runs wrote
them into every row, which reads the same)."""

from __future__ import annotations

import json
import re
from numbers import Real
from pathlib import Path
from typing import Any

from unstable.tracking import keys

METRICS_FILE = "metrics.jsonl"
TABLES_FILE = "tables.jsonl"
LATEST_TABLES_FILE = "tables.json"


def find_latest_run(runs_dir: str | Path = "runs") -> Path:
    """The run directory under `runs_dir` whose `metrics.jsonl` changed last."""
    files = sorted(Path(runs_dir).glob(f"*/{METRICS_FILE}"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no run with a {METRICS_FILE} under {Path(runs_dir).resolve()}")
    return files[-1].parent


def metrics_path(run_dir: str | Path) -> Path:
    """`run_dir/metrics.jsonl`, or a FileNotFoundError naming it when the run has written no row yet."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return path


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete row of the run's `metrics.jsonl`."""
    return RowFollower(run_dir).poll()


class RowFollower:
    """Follows a growing `metrics.jsonl`: each `poll()` returns the rows completed since the previous one (a
    line still being written waits for its newline), with the tables of their steps merged in."""

    def __init__(self, run_dir: str | Path):
        self.path = metrics_path(run_dir)
        self.rows = _LineFollower(self.path)
        self.tables = _LineFollower(self.path.with_name(TABLES_FILE))
        self.pending: dict[Any, dict[str, Any]] = {}  # tables read before their row (the Tracker writes them first)

    def poll(self) -> list[dict[str, Any]]:
        """The complete rows appended since the last call."""
        rows = self.rows.poll()
        self.pending |= {tables.pop(keys.STEP, None): tables for tables in self.tables.poll()}
        latest = _latest_tables(self.path.with_name(LATEST_TABLES_FILE))
        if rows and latest and latest.get(keys.STEP) == rows[-1].get(keys.STEP):
            self.pending[latest.pop(keys.STEP, None)] = latest
        for row in rows:
            row.update(self.pending.pop(row.get(keys.STEP), {}))
        return rows


class _LineFollower:
    """The complete JSON lines appended to a file since the last `poll` (none while it does not exist)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


def _latest_tables(path: Path) -> dict[str, Any]:
    """The newest tables (`LATEST_TABLES_FILE`, replaced atomically), empty before the first."""
    return json.loads(path.read_text()) if path.is_file() else {}


def learner_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows written at a learner step (row 0 is the initial evaluation; the final summary row has none)."""
    return [row for row in rows if keys.STEP in row]


def eval_window_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learner rows whose rolling eval window holds eval games that the previous such row's did not (a window
    that only repeats earlier games, such as the start evaluation's, is not a new measurement)."""
    fresh, seen = [], -1
    for row in learner_rows(rows):
        total = row.get(keys.TOTAL_EVAL_GAMES, seen + 1)
        if row.get(keys.EVAL_GAMES) and total > seen:
            fresh.append(row)
            seen = total
    return fresh


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """`(steps, values)` of a numeric metric over the learner rows that hold it."""
    points = [(row[keys.STEP], row[key]) for row in learner_rows(rows) if isinstance(row.get(key), Real)]
    return [step for step, _ in points], [float(value) for _, value in points]


def latest_value(rows: list[dict[str, Any]], key: str, default: Any = None) -> Any:
    """The newest value of `key` in `rows` (`default` when no row has it)."""
    return next((row[key] for row in reversed(rows) if key in row), default)


def final_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row a finished run writes last (with `eval_start` and `eval_end`); empty while running."""
    return next((row for row in reversed(rows) if row.get("final")), {})


def agent_label(agent: str) -> str:
    """How a table shows `agent`: the run's starting policy (`ckpt--1`, its warm start or base model) says so."""
    return "start (ckpt--1)" if agent == "ckpt--1" else agent


def agent_order(agent: str) -> tuple[int, int, str]:
    """Sort key: checkpoints (`ckpt-<k>`) newest first, then fixed opponents by name."""
    match = re.fullmatch(r"ckpt-(-?\d+)", agent)
    return (0, -int(match.group(1)), agent) if match else (1, 0, agent)


def games_by_agent(matrix: dict[str, dict[str, dict[str, Any]]]) -> dict[str, int]:
    """Each agent's games in a `pool/match_matrix` (its row's cells; a game between two agents fills both rows)."""
    return {agent: sum(cell["games"] for cell in opponents.values()) for agent, opponents in matrix.items()}


def busiest_agents(matrix: dict[str, dict[str, dict[str, Any]]], limit: int) -> list[str]:
    """The `limit` agents with the most games in a `pool/match_matrix`, in `agent_order`."""
    games = games_by_agent(matrix)
    busiest = sorted(games, key=lambda agent: -games[agent])[:limit]
    return sorted(busiest, key=agent_order)
