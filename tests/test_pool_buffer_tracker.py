"""Pure logic without models or Ray: ratings, opponent sampling, the StepBuffer, reward transforms, Tracker."""

import json
from dataclasses import replace

import pytest

import unstable.reward_transformations as retra
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig, RewardStages
from unstable.pool import ModelPool, Rating, RatingSystem
from unstable.pool.config import PoolConfig
from unstable.records import GameRecord, Step
from unstable.tracking import Tracker, TrackerConfig, keys, summarize_game, wilson_interval
from unstable.tracking.tracker import entropy_bits


def _step(pid, turn, tokens=(5, 6)):
    return Step(
        env_id="TicTacToe-v0-train",
        player_id=pid,
        turn=turn,
        observation="o",
        action="[1]",
        prompt_token_ids=(1, 2, 3),
        completion_token_ids=tokens,
        behaviour_logprobs=(-0.5,) * len(tokens),
    )


def _game(rewards, learner_ids=(0, 1), players=None, **kw):
    steps = tuple(_step(t % 2, t) for t in range(4))
    return GameRecord(
        "TicTacToe-v0-train",
        0,
        players or {0: "ckpt-0", 1: "ckpt-0"},
        steps,
        rewards,
        learner_player_ids=learner_ids,
        **kw,
    )


@pytest.mark.parametrize("backend", ["openskill", "trueskill"])
def test_rating_updates_move_winner_up(backend):
    ratings = RatingSystem(backend)
    assert ratings.win_probability("a", "b") == pytest.approx(0.5)
    for _ in range(5):
        ratings.rate({"a": 1.0, "b": -1.0})
    assert ratings.get("a").mu > 25 > ratings.get("b").mu
    assert ratings.get("a").sigma < 25 / 3
    assert ratings.win_probability("a", "b") > 0.8
    before = ratings.get("a")
    ratings.rate({"a": 0.0, "a2": 0.0})  # a draw moves both toward each other
    assert ratings.get("a").mu < before.mu


def test_unknown_rating_backend():
    with pytest.raises(ValueError, match="openskill"):
        RatingSystem("elo")


def test_pool_mirror_fixed_and_ratings():
    pool = ModelPool(PoolConfig(sample_mode="mirror"))
    with pytest.raises(RuntimeError, match="add_checkpoint"):
        pool.latest()
    base = pool.add_checkpoint(path=None, iteration=-1)
    assert pool.sample_opponent().checkpoint == base
    pool.record_game(_game({0: 1, 1: -1}, players={0: "ckpt--1", 1: "random"}))
    assert pool.ratings.get("ckpt--1").mu > pool.ratings.get("random").mu
    new = pool.add_checkpoint(path="/tmp/x", iteration=0)
    assert pool.latest() == new and new.version == 0
    assert pool.ratings.get(new.uid) == Rating()  # the prior: its rating will measure its own games

    fixed = ModelPool(PoolConfig(sample_mode="fixed", fixed_opponents=["random"]))
    fixed.add_checkpoint(None, -1)
    assert fixed.sample_opponent().fixed == "random"
    with pytest.raises(ValueError, match="fixed_opponents"):
        PoolConfig(sample_mode="fixed")
    with pytest.raises(ValueError, match=r"unknown sample_mode 'best'; valid: \['exploration', 'fixed', 'lagged'"):
        PoolConfig(sample_mode="best")


def test_pool_metrics_hold_the_rating_ladder():
    pool = ModelPool(PoolConfig(ladder_min_games=1))
    pool.add_checkpoint(path=None, iteration=-1)
    pool.record_game(_game({0: 1, 1: -1}, players={0: "ckpt--1", 1: "random"}))
    pool.ratings.set("tictactoe-minimax", Rating(40.0, 1.0, games=0))  # the best score, but on no games
    metrics = pool.metrics()
    assert metrics[keys.POOL_GAMES_RATED] == 1 and metrics[keys.POOL_CHECKPOINTS] == 1
    assert metrics[keys.POOL_ACTIVE_CHECKPOINTS] == 1
    ladder = metrics[keys.POOL_LADDER]
    assert [entry["agent"] for entry in ladder] == ["ckpt--1", "random", "tictactoe-minimax"]  # ranked first
    assert [entry["games"] for entry in ladder] == [1, 1, 0]
    assert [entry["provisional"] for entry in ladder] == [False, False, True]
    assert ladder[2]["win_probability"] is None and ladder[2]["match_quality"] is None  # no odds from no games
    assert ladder[0]["conservative"] == pytest.approx(ladder[0]["mu"] - 3 * ladder[0]["sigma"])
    assert metrics[keys.POOL_LATEST_MU] == ladder[0]["mu"]
    assert ladder[0]["win_probability"] == pytest.approx(0.5)  # the latest against itself
    assert ladder[1]["win_probability"] == pytest.approx(pool.ratings.win_probability("random", "ckpt--1"))
    assert ladder[1]["win_probability"] < 0.5
    assert ladder[1]["match_quality"] == pytest.approx(pool.ratings.match_quality("random", "ckpt--1"))
    assert metrics[keys.POOL_MATCH_MATRIX]["random"]["ckpt--1"] == {
        "games": 1,
        "wins": 0,
        "draws": 0,
        "losses": 1,
        "win_rate": 0.0,
    }


def test_failed_game_changes_no_rating():
    pool = ModelPool()
    pool.add_checkpoint(None, -1)
    pool.record_game(_game({}, error="boom"))
    assert pool.games_played == 0 and pool.ratings.ratings == {}


def test_buffer_applies_final_and_step_transforms_without_mutation():
    class ShapedWinBonus(retra.FinalRewardTransform):  # the seed's example, verbatim
        def __call__(self, x, env_id=None):
            return {pid: r + 0.1 if r > 0 else r for pid, r in x.items()}

    buffer = StepBuffer(
        BufferConfig(max_buffer_size=10),
        stages=RewardStages(final=retra.ComposeFinalRewardTransforms([retra.WinDrawLossFormatter(), ShapedWinBonus()])),
    )
    game = _game({0: 3.0, 1: -2.0})
    assert buffer.add_game(game) == 4
    assert all(s.reward == 0.0 for s in game.steps)  # the record is untouched
    batch = buffer.get_batch(4)
    assert sorted(s.reward for s in batch) == [-1.0, -1.0, 1.1, 1.1]
    assert buffer.size() == 0


def test_buffer_keeps_only_learner_steps_with_tokens_and_skips_failed_and_eval():
    buffer = StepBuffer(BufferConfig(max_buffer_size=3))
    assert buffer.add_game(_game({0: 1, 1: -1}, learner_ids=(1,))) == 2
    assert {s.player_id for s in buffer.steps} == {1}
    assert buffer.add_game(_game({}, error="crash")) == 0
    assert buffer.add_game(_game({0: 1, 1: -1}, is_eval=True)) == 0
    buffer.add_game(_game({0: 0, 1: 0}))  # 4 more steps into a buffer of 3: oldest dropped
    assert buffer.size() == 3 and buffer.metrics()[keys.BUFFER_STEPS_DROPPED] == 3
    with pytest.raises(ValueError, match="holds 3"):
        buffer.get_batch(5)


def test_win_draw_loss_formatter():
    fmt = retra.WinDrawLossFormatter()
    assert fmt({0: 1, 1: -1}) == {0: 1.0, 1: -1.0}
    assert fmt({0: 0.0, 1: 0.0}) == {0: 0.0, 1: 0.0}
    assert fmt({0: 5, 1: 2, 2: 2}) == {0: 1.0, 1: -1.0, 2: -1.0}


def test_tracker_writes_jsonl_rows_with_window_aggregates(tmp_path):
    tracker = Tracker(tmp_path)
    tracker.add_game(summarize_game(_game({0: 1, 1: -1}, learner_ids=(0,), wall_seconds=0.1)))
    tracker.add_game(summarize_game(_game({0: -1, 1: 1}, learner_ids=(0,), is_eval=True)))
    tracker.add_source(_Gauge())
    row = tracker.log({"learner/step": 1})
    assert row["gauge/value"] == 7  # sources are read into every row
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1]) == row
    assert row["collector/train_games"] == 1 and row["eval/games"] == 1 and row["eval/loss_rate"] == 1.0
    assert row["collector/format_ok_rate"] == 1.0
    assert (row["eval/win_rate"], row["eval/win_low"], row["eval/win_high"]) == (0.0, 0.0, wilson_interval(0, 1)[1])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["learner/step"] == 1
    later = tracker.log()  # counts cover the games since the previous row, rates the rolling window of games
    assert later["collector/train_games"] == 0 and later["collector/games_per_s"] == 0
    assert later["eval/games"] == 1 and later["eval/loss_rate"] == 1.0


def test_tracker_rates_cover_a_rolling_window_of_games(tmp_path):
    tracker = Tracker(tmp_path, cfg=TrackerConfig(window_games=2))
    for outcome in ({0: 1, 1: -1}, {0: -1, 1: 1}, {0: -1, 1: 1}):
        tracker.add_game(summarize_game(_game(outcome, learner_ids=(0,), is_eval=True)))
    row = tracker.log()
    assert row[keys.EVAL_GAMES] == 2 and row[keys.EVAL_LOSS_RATE] == 1.0  # the first game left the window
    assert row[keys.EVAL_WIN_HIGH] == wilson_interval(0, 2)[1]


def test_tracker_reports_game_timing_and_action_entropy(tmp_path):
    tracker = Tracker(tmp_path)
    steps = tuple(_step(t % 2, t) for t in range(4))
    moves = ("[0]", "[4]", "[0]", "[8]")  # the learner (seat 0) plays [0] twice: entropy 0 bits
    record = GameRecord(
        "TicTacToe-v0-train",
        0,
        {0: "ckpt-0", 1: "ckpt-0"},
        tuple(replace(s, action=m) for s, m in zip(steps, moves)),
        {0: 1, 1: -1},
        learner_player_ids=(0, 1),
        wall_seconds=2.0,
    )
    tracker.add_game(summarize_game(record))
    row = tracker.log()
    assert row[keys.MEAN_GAME_SECONDS] == 2.0 and row[keys.SECONDS_PER_TURN] == 0.5
    assert row[keys.DISTINCT_ACTIONS] == 3
    assert row[keys.ACTION_ENTROPY] == pytest.approx(entropy_bits(["[0]", "[0]", "[4]", "[8]"]))
    assert entropy_bits(["a", "a", "b", "b"]) == 1.0 and entropy_bits([]) == 0.0


class _Gauge:
    def metrics(self):
        return {"gauge/value": 7}


def test_a_wandb_project_without_wandb_installed_names_the_extra(tmp_path, monkeypatch):
    import sys

    from unstable.tracking.sinks import WandbSink

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"unstable-baselines\[wandb\]"):
        WandbSink("UB", "demo", tmp_path)


@pytest.mark.slow
def test_wandb_offline_sink_writes_its_run_files(tmp_path, monkeypatch):
    from unstable.tracking.sinks import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracker(tmp_path, [WandbSink("UB", "demo", tmp_path, mode="offline")])
    tracker.log({keys.STEP: 1, keys.LOSS: 0.5, keys.POOL_LADDER: []})
    tracker.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb"))
