"""`unstable report`: the plotted numbers are the run's JSONL values, and every PNG and report.md is written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import GameRecord
from unstable.report import data, write_report
from unstable.report.write import summary_markdown
from unstable.tracking import Tracker, TrackerConfig, keys
from unstable.tracking.history import latest_value, read_rows
from unstable.tracking.tracker import summarize_game

RECORDED_RUN = Path(__file__).parent / "fixtures" / "recorded_run"


def _jsonl_rows():
    return [json.loads(line) for line in (RECORDED_RUN / "metrics.jsonl").read_text().splitlines()]


def test_plot_data_are_the_jsonl_values():
    raw = _jsonl_rows()
    learner = [row for row in raw if keys.STEP in row]
    rows = read_rows(RECORDED_RUN)

    curve = data.eval_curve(rows)
    totals = [row[keys.TOTAL_EVAL_GAMES] for row in learner]
    with_eval = [row for i, row in enumerate(learner) if row[keys.EVAL_GAMES] and (i == 0 or totals[i] > totals[i - 1])]
    assert curve["steps"] == [row[keys.STEP] for row in with_eval] and curve["steps"][0] == 0
    assert len(curve["steps"]) > 1  # the recorded run played eval games beside training
    assert curve["win_rate"] == [row[keys.EVAL_WIN_RATE] for row in with_eval]
    assert curve["low"] == [row[keys.EVAL_WIN_LOW] for row in with_eval]
    assert curve["high"] == [row[keys.EVAL_WIN_HIGH] for row in with_eval]

    ratings = data.rating_history(rows)
    games = [row[keys.POOL_MATCH_MATRIX].get("tictactoe-minimax", {}) for row in learner]
    games = [sum(cell["games"] for cell in cells.values()) for cells in games]
    played = [row for i, row in enumerate(learner) if games[i] and (i == 0 or games[i] != games[i - 1])]
    minimax = [next(e for e in row[keys.POOL_LADDER] if e["agent"] == "tictactoe-minimax") for row in played]
    assert ratings["tictactoe-minimax"]["sigma"] == [entry["sigma"] for entry in minimax]
    assert ratings["tictactoe-minimax"]["steps"] == [row[keys.STEP] for row in played]
    assert not any(name.startswith("ckpt-") for name in ratings)  # checkpoints: one point each, below
    reference = data.reference_opponent(rows)
    relative = data.rating_history(rows, relative_to=reference)
    levels = [next(e["mu"] for e in row[keys.POOL_LADDER] if e["agent"] == reference) for row in played]
    assert relative["tictactoe-minimax"]["mu"] == pytest.approx([e["mu"] - lv for e, lv in zip(minimax, levels)])
    newest = [row for row in raw if keys.POOL_LADDER in row][-1][keys.POOL_LADDER]
    level = next(e["mu"] for e in newest if e["agent"] == reference)
    checkpoints = sorted((e for e in newest if e["agent"].startswith("ckpt-")), key=lambda e: int(e["agent"][5:]))
    points = data.checkpoint_ratings(rows, relative_to=reference)
    assert points["steps"] == [max(int(e["agent"][5:]), 0) for e in checkpoints] and points["steps"][0] == 0
    assert points["mu"] == pytest.approx([e["mu"] - level for e in checkpoints])
    assert points["sigma"] == [e["sigma"] for e in checkpoints]

    table = raw[-1][keys.POOL_MATCH_MATRIX]
    matrix = data.match_matrix(rows)
    i, j = matrix["agents"].index("tictactoe-minimax"), matrix["agents"].index("ckpt--1")
    assert matrix["win_rate"][i][j] == table["tictactoe-minimax"]["ckpt--1"]["win_rate"]
    assert matrix["games"][i][j] == table["tictactoe-minimax"]["ckpt--1"]["games"]
    assert matrix["win_rate"][j][j] is None

    lines = data.metric_lines(rows, data.LOSS_KEYS + data.THROUGHPUT_KEYS)
    assert set(lines) == {keys.LOSS, keys.PG_LOSS, *data.THROUGHPUT_KEYS}  # only what the run reported
    assert lines[keys.LOSS][1] == [row[keys.LOSS] for row in learner if keys.LOSS in row]
    assert lines[keys.GAMES_PER_S][1] == [row[keys.GAMES_PER_S] for row in learner]


@pytest.mark.slow
def test_the_report_writes_every_plot_and_a_summary(tmp_path):
    path = write_report(RECORDED_RUN, tmp_path / "report")
    pngs = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pngs == ["eval_win_rate.png", "losses.png", "match_heatmap.png", "ratings.png", "throughput.png"]
    for name in pngs:
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / "report" / name).stat().st_size > 10_000
    markdown = path.read_text()
    final = _jsonl_rows()[-1]
    start, end = final["eval_start"], final["eval_end"]
    assert f"| start | {start['games']} | {start['win_rate']:.2f} | [{start['win_ci'][0]:.2f}" in markdown
    assert f"| end | {end['games']} | {end['win_rate']:.2f} |" in markdown
    assert "- learner steps: 20" in markdown and "![match_heatmap](match_heatmap.png)" in markdown


@pytest.mark.slow
def test_unstable_report_command(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "unstable.cli.main", "report", str(RECORDED_RUN), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "report.md").is_file()
    missing = subprocess.run(
        [sys.executable, "-m", "unstable.cli.main", "report", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_run_without_learner_rows_has_nothing_to_report(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({keys.TIME: 1.0}) + "\n")
    with pytest.raises(ValueError, match="no learner rows"):
        write_report(tmp_path)


def test_the_ladder_table_gives_games_and_marks_provisional_agents():
    ladder = [
        {"agent": "ckpt-9", "mu": 28.0, "sigma": 0.8, "conservative": 25.6, "games": 1000, "provisional": False},
        {"agent": "ckpt-4", "mu": 37.0, "sigma": 3.0, "conservative": 28.0, "games": 8, "provisional": True},
    ]
    markdown = summary_markdown("run", [{keys.STEP: 9, keys.POOL_LADDER: ladder}], [])
    assert "| ckpt-9 | 28.00 | 0.80 | 25.60 | 1000 |" in markdown
    assert "| ckpt-4 (provisional) | 37.00 | 3.00 | 28.00 | 8 |" in markdown


def test_the_training_curve_counts_every_game_of_the_window_the_pool_kept_or_forgot(tmp_path):
    """A pool keeping 1 retired checkpoint, forgetting the others: the report's ratings still show every
    checkpoint (from the tables that held them), and its training curve is the collector's window over every game,
    whichever checkpoint played it (it pooled the match matrix's surviving checkpoints before: the best rated)."""
    pool = ModelPool(PoolConfig(fixed_opponents=["random"], max_active_lora=1, max_retired=1))
    tracker = Tracker(tmp_path, cfg=TrackerConfig(tables_every=1, window_games=8, tensorboard=False, wandb="disabled"))
    tracker.add_source(pool)
    for k in range(1, 7):
        pool.add_checkpoint(f"/ckpt-{k}", iteration=k)
        for seed in range(4):
            rewards = {0: 1.0 if seed < k % 3 + 1 else 0.0, 1: 0.0}  # ckpt-k wins k % 3 + 1 of its 4 games
            record = GameRecord(
                "TicTacToe-v0-train", seed, {0: f"ckpt-{k}", 1: "random"}, (), rewards, learner_player_ids=(0,)
            )
            pool.record_game(record)
            tracker.add_game(summarize_game(record))
        tracker.log({keys.STEP: k})
    rows = read_rows(tmp_path)
    assert len(latest_value(rows, keys.POOL_LADDER)) == 3  # random, the active checkpoint, 1 retired
    assert data.checkpoint_ratings(rows)["steps"] == [1, 2, 3, 4, 5, 6]
    training = data.training_win_rate(rows, "random")
    wins = [k % 3 + 1 for k in range(1, 7)]  # per checkpoint, of 4 games; the window holds the last 8 games
    expected = [wins[0] / 4] + [(wins[k - 1] + wins[k]) / 8 for k in range(1, 6)]
    assert training == {"steps": [1, 2, 3, 4, 5, 6], "win_rate": pytest.approx(expected), "games": [4] + [8] * 5}
