"""Games of any size through the Collector: 1-player and 3-player TextArena games are played, their steps
reach the buffer and their results the pool's ratings, like 2-player ones."""

from __future__ import annotations

import random

from unstable.buffer import StepBuffer
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.games.moves import legal_moves
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.pool.ratings import Rating
from unstable.records import EnvSpec, GenerationResult
from unstable.rewards import WinDrawLossFormatter
from unstable.tracking import Tracker, keys


class _FakeEngine:
    """Answers every request with a legal move when the prompt lists them, else a number to guess."""

    def __init__(self):
        self.rng = random.Random(0)

    def generate(self, request):
        move = self.rng.choice(legal_moves(request.prompt) or [f"[{self.rng.randint(1, 20)}]"])
        return GenerationResult(f"\\boxed{{{move}}}", (1, 2), (3,), (-0.5,))


def _collector(tmp_path, spec: EnvSpec, pool_cfg: PoolConfig) -> tuple[Collector, ModelPool, StepBuffer]:
    pool = ModelPool(pool_cfg)
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(256, final_reward_transformation=WinDrawLossFormatter())
    cfg = CollectorConfig(training_envs=[spec], max_turns=60)
    return Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), cfg), pool, buffer


def test_a_one_player_game_is_rated_against_the_env(tmp_path):
    spec = EnvSpec("GuessTheNumber-v0-train", 1, "qwen3-zs")
    collector, pool, buffer = _collector(tmp_path, spec, PoolConfig(sample_mode="mirror"))
    records = [collector.play_one(is_eval=False) for _ in range(4)]
    assert all(not r.failed and r.learner_player_ids == (0,) and len(r.players) == 1 for r in records)
    assert buffer.size() == sum(len(r.steps) for r in records) > 0
    ladder = {entry["agent"] for entry in pool.metrics()[keys.POOL_LADDER]}
    assert {"ckpt--1", "env:GuessTheNumber-v0-train"} <= ladder
    assert pool.games_played == 4


def test_a_three_player_game_seats_an_opponent_in_every_other_seat_and_updates_ratings(tmp_path):
    spec = EnvSpec("ThreePlayerTicTacToe-v0-train", 3, "qwen3-zs")
    collector, pool, buffer = _collector(tmp_path, spec, PoolConfig(sample_mode="fixed", fixed_opponents=["random"]))
    records = [collector.play_one(is_eval=False) for _ in range(6)]
    assert all(not r.failed and len(r.players) == 3 for r in records)
    assert {r.learner_player_ids[0] for r in records} == {0, 1, 2}  # the learner takes every seat in turn
    for record in records:
        others = {agent for pid, agent in record.players.items() if pid not in record.learner_player_ids}
        assert others == {"random"}
    assert buffer.size() > 0 and pool.games_played == 6
    assert pool.ratings.get("ckpt--1") != Rating() and pool.ratings.get("random") != Rating()
    assert pool.metrics()[keys.POOL_MATCH_MATRIX]["ckpt--1"]["random"]["games"] == 6


def test_evaluation_opponents_take_turns_and_meet_every_seat(tmp_path):
    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    pool = ModelPool()
    pool.add_checkpoint(path=None, iteration=-1)
    cfg = CollectorConfig(training_envs=[spec], evaluation_opponents=["random", "tictactoe-minimax"])
    collector = Collector(_FakeEngine(), pool, StepBuffer(16), Tracker(tmp_path), cfg)
    records = collector.evaluate(8, concurrency=1)
    met = {(r.players[1 - r.learner_player_ids[0]], r.learner_player_ids[0]) for r in records}
    assert met == {(o, seat) for o in ("random", "tictactoe-minimax") for seat in (0, 1)}
    assert {e["agent"] for e in pool.metrics()[keys.POOL_LADDER]} >= {"random", "tictactoe-minimax"}  # rated


def test_a_full_buffer_pauses_new_training_games_until_the_learner_takes_a_batch(tmp_path):
    import threading
    import time

    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    pool = ModelPool(PoolConfig(sample_mode="fixed", fixed_opponents=["random"]))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(4)
    cfg = CollectorConfig(training_envs=[spec], pause_when_buffer_full=True)
    collector = Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), cfg)
    runner = threading.Thread(target=collector.collect, args=(2,))
    runner.start()
    while not buffer.is_full():
        time.sleep(0.05)
    time.sleep(0.6)  # three rounds of the collector's loop: at most the two games in flight may finish
    paused_at = pool.games_played
    time.sleep(0.6)
    assert pool.games_played == paused_at and buffer.counters[keys.BUFFER_STEPS_DROPPED] <= 2 * 5
    buffer.get_batch(4)  # the learner takes a batch: collection resumes
    while pool.games_played == paused_at:
        time.sleep(0.05)
    collector.stop()
    runner.join(timeout=10)
    assert not runner.is_alive()
