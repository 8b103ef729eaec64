"""The ModelPool's sampling modes against their exact rules, config validation, and rating of 1- to 3-player games."""

import math
from collections import Counter

import pytest
import trueskill

from unstable.config import ConfigError, validate_config
from unstable.pool import SAMPLE_MODES, ModelPool, Rating, RatingSystem
from unstable.pool.config import PoolConfig
from unstable.records import GameRecord
from unstable.tracking import keys

FIXED = ["random", "tictactoe-minimax"]
# five checkpoints, the newest three active: ckpt--1 and ckpt-0 are retired
RATINGS = {
    "ckpt--1": Rating(25.0, 12.0),  # retired, rated as the best candidate of every weighted mode
    "ckpt-0": Rating(27.0, 12.0),
    "ckpt-1": Rating(20.0, 3.0),
    "ckpt-2": Rating(26.0, 5.0),
    "ckpt-3": Rating(25.0, 2.0),  # the latest
    "random": Rating(10.0, 1.0),
    "tictactoe-minimax": Rating(31.0, 6.0),
}
CANDIDATES = ["ckpt-1", "ckpt-2", "random", "tictactoe-minimax"]
BETA = 4.0
DRAWS = 4000


def _pool(mode, fixed=FIXED, checkpoints=5, max_active_lora=3, **cfg):
    pool = ModelPool(
        PoolConfig(sample_mode=mode, fixed_opponents=fixed, max_active_lora=max_active_lora, **cfg), seed=7
    )
    for iteration in range(-1, checkpoints - 1):
        pool.add_checkpoint(f"/ckpt/{iteration}" if iteration >= 0 else None, iteration)
    for uid, rating in RATINGS.items():
        pool.ratings.set(uid, rating)
    return pool


def _empirical(pool, draws=DRAWS):
    counts = Counter(pool.sample_opponent().agent_id for _ in range(draws))
    return {agent: n / draws for agent, n in counts.items()}


def _normalised(weights):
    total = sum(weights.values())
    return {agent: w / total for agent, w in weights.items()}


def _assert_close(empirical, expected):
    assert set(empirical) <= set(expected), f"sampled outside the rule: {set(empirical) - set(expected)}"
    assert max(abs(empirical.get(a, 0.0) - p) for a, p in expected.items()) < 0.03


def _ts_quality(a, b):
    env = trueskill.TrueSkill(beta=BETA)
    ra, rb = RATINGS[a], RATINGS[b]
    return trueskill.quality_1vs1(env.create_rating(ra.mu, ra.sigma), env.create_rating(rb.mu, rb.sigma), env=env)


EXPECTED = {
    "random": {a: 1 / 5 for a in ["ckpt-1", "ckpt-2", "ckpt-3", *FIXED]},
    "match-quality": _normalised({a: _ts_quality("ckpt-3", a) for a in CANDIDATES}),
    "ts-dist": _normalised(
        {a: math.exp(-abs(25.0 - RATINGS[a].mu) / math.hypot(BETA, 2.0, RATINGS[a].sigma)) for a in CANDIDATES}
    ),
    "exploration": _normalised({a: RATINGS[a].sigma ** 2 for a in CANDIDATES}),
    "fixed": {a: 1 / 2 for a in FIXED},
    "mirror": {"ckpt-3": 1.0},
    "lagged": {"ckpt-2": 1.0},
}


def test_every_mode_is_registered_with_its_rule():
    assert set(SAMPLE_MODES) == set(EXPECTED)
    assert all(fn.__doc__ for fn in SAMPLE_MODES.values())


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_mode_matches_its_exact_distribution(mode):
    empirical = _empirical(_pool(mode))
    _assert_close(empirical, EXPECTED[mode])
    assert not {"ckpt--1", "ckpt-0"} & set(empirical)  # retired checkpoints are never sampled


def test_lagged_draws_uniformly_from_the_lag_previous_checkpoints():
    assert set(_empirical(_pool("lagged", lag=2, max_active_lora=4), 200)) == {"ckpt-1", "ckpt-2"}
    _assert_close(_empirical(_pool("lagged", lag=2)), {"ckpt-1": 0.5, "ckpt-2": 0.5})
    assert set(_empirical(_pool("lagged", lag=2, checkpoints=2), 50)) == {"ckpt--1"}  # fewer than lag exist
    assert set(_empirical(_pool("lagged", checkpoints=1), 50)) == {"ckpt--1"}  # none before the latest: itself
    with pytest.raises(ValueError, match="max_active_lora > lag"):
        PoolConfig(sample_mode="lagged", lag=3, max_active_lora=3)


@pytest.mark.parametrize("mode", ["match-quality", "ts-dist", "exploration"])
def test_weighted_modes_without_candidates_play_the_latest(mode):
    assert set(_empirical(_pool(mode, fixed=[], checkpoints=1), 50)) == {"ckpt--1"}


def test_sample_match_draws_one_opponent_per_other_seat():
    pool = _pool("fixed")
    assert pool.sample_match(0) == (pool.latest(), [])
    learner, opponents = pool.sample_match(3)
    assert learner == pool.latest() and len(opponents) == 3 and {o.fixed for o in opponents} <= set(FIXED)
    assert len(pool.sample_match()[1]) == 1
    with pytest.raises(ValueError, match="num_opponents"):
        pool.sample_match(-1)


def test_unknown_mode_fails_at_config_load_naming_every_mode():
    data = {"model": {"path": "m"}, "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]}}
    with pytest.raises(ConfigError) as err:
        validate_config({**data, "pool": {"sample_mode": "best"}})
    assert "pool.sample_mode = 'best'" in str(err.value)
    assert all(repr(mode) in str(err.value) for mode in SAMPLE_MODES)


def test_beta_reaches_the_trueskill_environment():
    pool = ModelPool()
    assert pool.cfg.rating_backend == "trueskill" and pool.ratings.beta == 4.0
    assert isinstance(pool.ratings._model, trueskill.TrueSkill) and pool.ratings._model.beta == 4.0
    assert ModelPool(PoolConfig(beta=2.5)).ratings._model.beta == 2.5


def test_a_new_checkpoint_starts_from_the_prior_not_from_its_parents_rating():
    pool = ModelPool(PoolConfig(sample_mode="fixed", fixed_opponents=["random"], rating_anchor="random"))
    parent = pool.add_checkpoint(None, -1)
    pool.ratings.set(parent.uid, Rating(34.0, 0.8))  # well measured: its children were pinned near it
    child = pool.add_checkpoint("/ckpt/0", 0)
    assert pool.ratings.get(child.uid) == Rating() == Rating(pool.ratings.get("random").mu, 25.0 / 3.0)


@pytest.mark.parametrize("mode", ["match-quality", "ts-dist"])
def test_weighted_modes_sample_broadly_for_a_fresh_checkpoint_and_closely_once_it_is_rated(mode):
    pool = ModelPool(PoolConfig(sample_mode=mode, fixed_opponents=FIXED, rating_anchor="random", max_active_lora=2))
    pool.add_checkpoint("/ckpt/0", 0)
    pool.ratings.set("ckpt-0", Rating(31.0, 1.0))
    pool.ratings.set("tictactoe-minimax", Rating(41.0, 1.0))
    pool.add_checkpoint("/ckpt/1", 1)  # unrated: anywhere from random's level to minimax's is plausible
    fresh = _empirical(pool)
    assert min(fresh.values()) > 1 / 12, fresh  # a quarter of uniform at least: no candidate is ruled out
    pool.ratings.set("ckpt-1", Rating(41.0, 1.0))  # now rated as strong as minimax
    rated = _empirical(pool)
    assert max(rated, key=rated.get) == "tictactoe-minimax" and rated.get("random", 0.0) < 0.05, rated


def test_an_anchor_keeps_its_rating_and_the_others_are_measured_against_it():
    pool = ModelPool(PoolConfig(sample_mode="fixed", fixed_opponents=["random"], rating_anchor="random"))
    for k in range(20):  # a chain of checkpoints, each a little better than random: no drift downwards
        pool.add_checkpoint(f"/ckpt/{k}", k)
        for game in range(10):
            rewards = {0: 1.0, 1: -1.0} if game % 3 else {0: -1.0, 1: 1.0}
            pool.record_game(_record({0: f"ckpt-{k}", 1: "random"}, rewards))
    assert pool.ratings.get("random") == Rating(25.0, 1.0, games=200)  # every game counted, the rating held
    assert pool.ratings.get("ckpt-19").mu > 25.0 and pool.ratings.get("ckpt-19").games == 10
    assert pool.ratings.win_probability("ckpt-19", "random") > 0.6
    with pytest.raises(ValueError, match="rating_anchor 'minimax' must be one of fixed_opponents"):
        PoolConfig(fixed_opponents=["random"], rating_anchor="minimax")


def test_rated_games_survive_a_state_round_trip():
    ratings = RatingSystem(anchors=frozenset({"random"}))
    for score in (1.0, 0.0, -1.0):
        ratings.rate({"ckpt-0": score, "random": 0.0})
    restored = RatingSystem(anchors=frozenset({"random"}))
    restored.load_state_dict(ratings.state_dict())
    assert restored.ratings == ratings.ratings and restored.get("ckpt-0").games == restored.get("random").games == 3
    restored.load_state_dict({"ckpt-0": [30.0, 2.0]})  # a state saved before games were counted
    assert restored.get("ckpt-0") == Rating(30.0, 2.0, games=0)


def _record(players, rewards, env_id="Game-v0"):
    return GameRecord(env_id, 0, players, (), rewards)


def test_one_player_game_is_rated_against_the_env():
    pool = ModelPool()
    pool.add_checkpoint(None, -1)
    pool.record_game(_record({0: "ckpt--1"}, {0: 1.0}, env_id="Wordle-v0"))
    assert pool.ratings.get("ckpt--1").mu > 25.0 > pool.ratings.get("env:Wordle-v0").mu
    matrix = pool.metrics()[keys.POOL_MATCH_MATRIX]
    assert matrix["ckpt--1"]["env:Wordle-v0"] == {"games": 1, "wins": 1, "draws": 0, "losses": 0, "win_rate": 1.0}
    assert matrix["env:Wordle-v0"]["ckpt--1"]["losses"] == 1


def test_three_player_game_rates_and_counts_every_pair():
    pool = ModelPool()
    pool.add_checkpoint(None, -1)
    pool.record_game(_record({0: "ckpt--1", 1: "random", 2: "tictactoe-minimax"}, {0: 1.0, 1: -1.0, 2: -1.0}))
    mus = {agent: pool.ratings.get(agent).mu for agent in ["ckpt--1", "random", "tictactoe-minimax"]}
    assert mus["ckpt--1"] > 25.0 > mus["random"] and mus["random"] == pytest.approx(mus["tictactoe-minimax"], abs=0.01)
    matrix = pool.metrics()[keys.POOL_MATCH_MATRIX]
    assert matrix["ckpt--1"]["random"]["wins"] == matrix["random"]["ckpt--1"]["losses"] == 1
    assert matrix["random"]["tictactoe-minimax"]["draws"] == 1
    assert sum(len(row) for row in matrix.values()) == 6  # every ordered pair of distinct agents


def test_seats_of_one_agent_count_once_and_mirror_self_play_rates_nothing():
    pool = ModelPool()
    pool.add_checkpoint(None, -1)
    pool.record_game(_record({0: "ckpt--1", 1: "ckpt--1"}, {0: 1.0, 1: -1.0}))
    assert pool.games_played == 1 and pool.ratings.ratings == {} and pool.metrics()[keys.POOL_MATCH_MATRIX] == {}
    pool.record_game(_record({0: "ckpt--1", 1: "ckpt--1", 2: "random"}, {0: 1.0, 1: 0.0, 2: -1.0}))
    assert pool.metrics()[keys.POOL_MATCH_MATRIX]["ckpt--1"]["random"]["games"] == 1


def test_retired_checkpoints_keep_ratings_and_matrix_rows():
    pool = ModelPool(PoolConfig(sample_mode="random", fixed_opponents=["random"], max_active_lora=2))
    pool.add_checkpoint(None, -1)
    pool.record_game(_record({0: "ckpt--1", 1: "random"}, {0: 1.0, 1: -1.0}))
    rating = pool.ratings.get("ckpt--1")
    for iteration in range(3):
        pool.add_checkpoint(f"/ckpt/{iteration}", iteration)
    assert [c.uid for c in pool.active_checkpoints()] == ["ckpt-1", "ckpt-2"]
    metrics = pool.metrics()
    assert metrics[keys.POOL_CHECKPOINTS] == 4 and metrics[keys.POOL_ACTIVE_CHECKPOINTS] == 2
    assert pool.ratings.get("ckpt--1") == rating and "ckpt--1" in {e["agent"] for e in metrics[keys.POOL_LADDER]}
    assert metrics[keys.POOL_MATCH_MATRIX]["ckpt--1"]["random"]["wins"] == 1
    assert set(_empirical(pool, 500)) == {"ckpt-1", "ckpt-2", "random"}
