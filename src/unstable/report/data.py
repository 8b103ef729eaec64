"""The numbers each plot of the report shows, taken from a run's rows (so tests can check them against the JSONL)."""

from __future__ import annotations

from typing import Any

from unstable.tracking import keys
from unstable.tracking.history import (
    agent_order,
    busiest_agents,
    eval_window_rows,
    games_by_agent,
    latest_value,
    learner_rows,
    series,
)

LOSS_KEYS = (
    keys.LOSS,
    keys.PG_LOSS,
    keys.VALUE_LOSS,
    keys.KL_LOSS,
    keys.ENTROPY_LOSS,
    keys.AWR_LOSS,
    keys.VF_PRE_LOSS,
    keys.VF_POST_LOSS,
)
THROUGHPUT_KEYS = (keys.GAMES_PER_S, keys.INFERENCE_TOKENS_PER_S, keys.TRAIN_TOKENS_PER_S)
MATRIX_AGENTS = 10  # the heatmap shows the agents with the most games, up to this many


def eval_curve(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Rolling eval win rate with its 95% Wilson interval at each learner step whose window holds new eval games."""
    with_games = eval_window_rows(rows)
    return {
        "steps": [row[keys.STEP] for row in with_games],
        "win_rate": [row[keys.EVAL_WIN_RATE] for row in with_games],
        "low": [row[keys.EVAL_WIN_LOW] for row in with_games],
        "high": [row[keys.EVAL_WIN_HIGH] for row in with_games],
        "games": [row[keys.EVAL_GAMES] for row in with_games],
    }


def rating_history(rows: list[dict[str, Any]], relative_to: str | None = None) -> dict[str, dict[str, list[float]]]:
    """For every fixed opponent, at the learner steps by which it had played more games: its TrueSkill mu and sigma.
    With `relative_to` an agent (see `reference_opponent`), mu minus that agent's mu at the same step: ratings only
    compare agents, and without an anchor their common level drifts."""
    history: dict[str, dict[str, list[float]]] = {}
    played: dict[str, int] = {}
    for row in learner_rows(rows):
        ladder = {entry["agent"]: entry for entry in row.get(keys.POOL_LADDER, [])}
        level = ladder[relative_to]["mu"] if relative_to in ladder else 0.0
        games = games_by_agent(row.get(keys.POOL_MATCH_MATRIX, {}))
        for agent, entry in ladder.items():
            if agent_order(agent)[0] == 1 and games.get(agent, 0) != played.get(agent):
                played[agent] = games.get(agent, 0)
                line = history.setdefault(agent, {"steps": [], "mu": [], "sigma": []})
                line["steps"].append(row[keys.STEP])
                line["mu"].append(entry["mu"] - level)
                line["sigma"].append(entry["sigma"])
    return history


def newest_by_agent(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Each agent's entry (`pool/ladder`) or row (`pool/match_matrix`) in the newest table of `key` that holds it: the
    pool forgets retired checkpoints beyond `pool.max_retired`, so the newest table lacks those it dropped (and one
    dropped between two table writes is in none)."""
    newest: dict[str, Any] = {}
    for row in rows:
        table = row.get(key, {})
        newest |= {entry["agent"]: entry for entry in table} if isinstance(table, list) else table
    return newest


def checkpoint_ratings(rows: list[dict[str, Any]], relative_to: str | None = None) -> dict[str, list[Any]]:
    """Each learner checkpoint's rating in the newest ladder that holds it (`newest_by_agent`), which rests on that
    checkpoint's own games, at the step that made it (the base model `ckpt--1` at 0): `{"steps", "mu", "sigma",
    "provisional"}`, oldest first, mu relative to `relative_to` (in the newest ladder) as in `rating_history`."""
    ladder = latest_value(rows, keys.POOL_LADDER, [])
    level = next((entry["mu"] for entry in ladder if entry["agent"] == relative_to), 0.0)

    def step(entry: dict[str, Any]) -> int:
        return max(-agent_order(entry["agent"])[1], 0)

    entries = newest_by_agent(rows, keys.POOL_LADDER).values()
    checkpoints = sorted((e for e in entries if agent_order(e["agent"])[0] == 0), key=step)
    return {
        "steps": [step(e) for e in checkpoints],
        "mu": [e["mu"] - level for e in checkpoints],
        "sigma": [e["sigma"] for e in checkpoints],
        "provisional": [bool(e.get("provisional")) for e in checkpoints],
    }


def reference_opponent(rows: list[dict[str, Any]]) -> str | None:
    """The rated fixed opponent with the most games in the newest match matrix (None when there is none)."""
    games = games_by_agent(latest_value(rows, keys.POOL_MATCH_MATRIX, {}))
    rated = {entry["agent"] for entry in latest_value(rows, keys.POOL_LADDER, [])}
    fixed = [agent for agent in games if agent_order(agent)[0] == 1 and agent in rated and not agent.startswith("env:")]
    return max(fixed, key=lambda agent: games[agent], default=None)


def training_win_rate(rows: list[dict[str, Any]], opponent: str) -> dict[str, list[float]]:
    """The learner's win rate in its training games against `opponent` over the collector's rolling window of
    training games (`collector/wdl_by_opponent`), at each learner step whose window holds such games: every game of
    the window counts, whichever checkpoint played it, so the curve is the numbers `unstable train` printed. (Pooling
    the match matrix's checkpoint rows counted only the checkpoints the pool still kept: the best rated.)"""
    curve: dict[str, list[float]] = {"steps": [], "win_rate": [], "games": []}
    for row in learner_rows(rows):
        cell = row.get(keys.TRAIN_WDL_BY_OPPONENT, {}).get(opponent)
        if cell and cell["games"]:
            curve["steps"].append(row[keys.STEP])
            curve["win_rate"].append(cell["win_rate"])
            curve["games"].append(cell["games"])
    return curve


def match_matrix(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest match matrix as `{"agents", "win_rate", "games"}`: square lists, row agent vs column agent,
    `None` where the two never met."""
    matrix = latest_value(rows, keys.POOL_MATCH_MATRIX, {})
    agents = busiest_agents(matrix, MATRIX_AGENTS)

    def cell(agent: str, opponent: str, field: str) -> float | None:
        return matrix.get(agent, {}).get(opponent, {}).get(field)

    return {
        "agents": agents,
        "win_rate": [[cell(agent, opponent, "win_rate") for opponent in agents] for agent in agents],
        "games": [[cell(agent, opponent, "games") for opponent in agents] for agent in agents],
    }


def metric_lines(rows: list[dict[str, Any]], metric_keys: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
    """`key -> (steps, values)` for each of `metric_keys` that some learner row holds."""
    lines = {key: series(rows, key) for key in metric_keys}
    return {key: line for key, line in lines.items() if line[0]}
