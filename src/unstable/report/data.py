"""The numbers each plot of the report shows, taken from a run's rows (so tests can check them against the JSONL)."""

from __future__ import annotations

from typing import Any

from unstable.tracking import keys
from unstable.tracking.history import agent_order, busiest_agents, latest_value, learner_rows, series

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
    """Rolling eval win rate with its 95% Wilson interval at each learner step that had eval games."""
    with_games = [row for row in learner_rows(rows) if row.get(keys.EVAL_GAMES)]
    return {
        "steps": [row[keys.STEP] for row in with_games],
        "win_rate": [row[keys.EVAL_WIN_RATE] for row in with_games],
        "low": [row[keys.EVAL_WIN_LOW] for row in with_games],
        "high": [row[keys.EVAL_WIN_HIGH] for row in with_games],
        "games": [row[keys.EVAL_GAMES] for row in with_games],
    }


def rating_history(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """For the latest checkpoint (as `latest`) and every agent that is not a later checkpoint (fixed opponents,
    the base model `ckpt--1`): its TrueSkill mu and sigma at each learner step."""
    history: dict[str, dict[str, list[float]]] = {}

    def add(name: str, step: int, mu: float, sigma: float) -> None:
        line = history.setdefault(name, {"steps": [], "mu": [], "sigma": []})
        line["steps"].append(step)
        line["mu"].append(mu)
        line["sigma"].append(sigma)

    for row in learner_rows(rows):
        if keys.POOL_LATEST_MU in row:
            add("latest", row[keys.STEP], row[keys.POOL_LATEST_MU], row[keys.POOL_LATEST_SIGMA])
        for entry in row.get(keys.POOL_LADDER, []):
            if agent_order(entry["agent"])[0] == 1 or entry["agent"] == "ckpt--1":
                add(entry["agent"], row[keys.STEP], entry["mu"], entry["sigma"])
    return history


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
