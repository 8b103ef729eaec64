"""The line `unstable train` prints per learner step shows what is learning: the training win rate against each
opponent over the tracker's rolling window, not a frozen evaluation (a run through `unstable train` prints it:
test_paced_run.py)."""

from unstable.cli.main import format_progress
from unstable.tracking import Tracker, TrackerConfig, keys


def _game(opponent: str | None, outcome: str) -> dict:
    """A training game's summary as the Tracker receives it (`summarize_game`'s keys the rates read)."""
    return {
        "env_id": "TicTacToe-v0-train",
        "is_eval": False,
        "failed": False,
        "error_type": None,
        "truncated": False,
        "outcome": outcome,
        "opponent": opponent,
        "turns": 5,
        "learner_steps": 3,
        "format_ok": 3,
        "invalid_moves": 0,
        "generated_tokens": 12,
        "wall_seconds": 0.1,
        "moves": ["[4]"],
    }


def test_the_tracker_rates_each_opponent_over_its_window_and_the_line_ranks_them(tmp_path):
    tracker = Tracker(tmp_path, cfg=TrackerConfig(window_games=8))
    games = [("random", "loss"), ("random", "win"), ("random", "win"), ("ckpt-1", "draw"), (None, "win")]
    for opponent, outcome in [("random", "loss"), *games, ("minimax", "loss"), ("ckpt-2", "win"), ("x", "win")]:
        tracker.add_game(_game(opponent, outcome))  # the first game leaves the window of 8
    row = tracker.log({keys.STEP: 3})
    by_opponent = row[keys.TRAIN_WDL_BY_OPPONENT]
    assert set(by_opponent) == {"random", "ckpt-1", "minimax", "ckpt-2", "x"}  # the mirror game has no opponent
    assert by_opponent["random"] == {"games": 3, "win_rate": 2 / 3, "draw_rate": 0.0, "loss_rate": 1 / 3}
    assert by_opponent["ckpt-1"]["draw_rate"] == 1.0
    line = format_progress(row, 10)
    assert line.endswith("| win vs random 0.67 (n=3), ckpt-1 0.00 (n=1), minimax 0.00 (n=1) +2 more"), line
    only_mirror = Tracker(tmp_path / "mirror")
    only_mirror.add_game(_game(None, "win"))
    assert format_progress(only_mirror.log({keys.STEP: 1}), 10).endswith("| win vs n/a")
