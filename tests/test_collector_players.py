"""Games of any size through the Collector: 1-player and 3-player TextArena games are played, their steps
reach the buffer and their results the pool's ratings, like 2-player ones."""

from __future__ import annotations

import random

import pytest

from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.games.moves import legal_moves
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.pool.ratings import Rating
from unstable.records import EnvSpec, GenerationResult
from unstable.tracking import Tracker, keys


class _FakeEngine:
    """Answers every request with a legal move when the prompt lists them, else a number to guess."""

    def __init__(self):
        self.rng = random.Random(0)

    def generate(self, request):
        move = self.rng.choice(legal_moves(request.prompt) or [f"[{self.rng.randint(1, 20)}]"])
        return GenerationResult(f"\\boxed{{{move}}}", (1, 2), (3,), (-0.5,))

    def end_game(self, game):
        pass


def _collector(tmp_path, spec: EnvSpec, pool_cfg: PoolConfig) -> tuple[Collector, ModelPool, StepBuffer]:
    pool = ModelPool(pool_cfg)
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=256))
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


def test_a_game_holds_the_checkpoints_it_plays_until_it_ends(tmp_path):
    """Retention may not delete the folder of a checkpoint a game in flight plays (it would load it again): the
    game holds its checkpoints in the pool from its start to its end, failed or not."""
    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    collector, pool, _ = _collector(tmp_path, spec, PoolConfig(sample_mode="mirror"))
    pool.add_checkpoint("ckpt-3-folder", iteration=3)
    held = []
    generate = collector.client.generate
    collector.client.generate = lambda request: held.append(pool.in_play()) or generate(request)
    collector.play_one(is_eval=False)
    assert held and all(versions == [3] for versions in held) and pool.in_play() == []


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
    collector = Collector(_FakeEngine(), pool, StepBuffer(BufferConfig(max_buffer_size=16)), Tracker(tmp_path), cfg)
    records = collector.evaluate(8, concurrency=1)
    met = {(r.players[1 - r.learner_player_ids[0]], r.learner_player_ids[0]) for r in records}
    assert met == {(o, seat) for o in ("random", "tictactoe-minimax") for seat in (0, 1)}
    assert {e["agent"] for e in pool.metrics()[keys.POOL_LADDER]} >= {"random", "tictactoe-minimax"}  # rated


def _collect_in_background(tmp_path, capacity: int, **cfg) -> tuple[Collector, ModelPool, StepBuffer, object]:
    """A collector of TicTacToe games against `random` into a StepBuffer of `capacity` steps that no learner
    empties, collecting on a thread of its own (the returned one)."""
    import threading

    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    pool = ModelPool(PoolConfig(sample_mode="fixed", fixed_opponents=["random"]))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=capacity))
    collector = Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), CollectorConfig(training_envs=[spec], **cfg))
    runner = threading.Thread(target=collector.collect, args=(8,))
    runner.start()
    return collector, pool, buffer, runner


def _until_idle(pool: ModelPool, quiet_s: float = 1.0, limit_s: float = 20.0) -> None:
    """Wait until no game finished for `quiet_s` seconds (at most `limit_s`)."""
    import time

    start, played, since = time.monotonic(), -1, time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - start < limit_s:
        if pool.games_played != played:
            played, since = pool.games_played, time.monotonic()
        time.sleep(0.05)


def test_pacing_starts_no_game_whose_steps_the_full_buffer_would_drop(tmp_path):
    import time

    # 8 slots, a buffer of 40 steps (about 13 games of 3 learner steps) and no learner taking batches: the games
    # in flight are counted before they finish, so the buffer fills and then nothing more is played or dropped
    collector, pool, buffer, runner = _collect_in_background(tmp_path, 40, pacing=True)
    _until_idle(pool)
    try:
        assert buffer.size() > 40 - 2 * 5  # filled up to about a game's steps of the capacity
        assert buffer.counters[keys.BUFFER_STEPS_DROPPED] <= 5  # at most one game's steps more than expected
        assert collector.metrics()[keys.GAMES_HELD_BACK] >= 8  # every slot waits once it is full
        time.sleep(0.5)  # a window of the held-back time in which every slot waits
        held = collector.metrics()
        assert held[keys.HELD_BACK_SHARE] == pytest.approx(1.0) and held[keys.HELD_BACK_SLOT_SECONDS] >= 8 * 0.5
        taken = buffer.get_batch(30)  # the learner takes a batch: collection resumes
        assert len(taken) == 30
        played = pool.games_played
        _until_idle(pool)
        assert pool.games_played > played and buffer.counters[keys.BUFFER_STEPS_DROPPED] <= 10
    finally:
        collector.stop()
        runner.join(timeout=10)
    assert not runner.is_alive()


def test_pacing_keeps_one_game_in_flight_with_a_buffer_smaller_than_a_game(tmp_path):
    # a buffer of 1 step holds less than any game adds: one game at a time is still played, so a learner
    # waiting for its batch could never wait forever; stop() still ends collection
    import time

    collector, pool, buffer, runner = _collect_in_background(tmp_path, 1, pacing=True)
    deadline = time.monotonic() + 20
    while pool.games_played < 6 and time.monotonic() < deadline:
        buffer.steps.clear()  # a learner taking whatever there is (one call: atomic beside the game threads)
        time.sleep(0.01)
    collector.stop()
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert pool.games_played >= 6


def test_without_pacing_every_finished_game_is_replaced_at_once(tmp_path):
    collector, pool, buffer, runner = _collect_in_background(tmp_path, 8, pacing=False)
    try:
        while buffer.counters[keys.BUFFER_STEPS_DROPPED] < 50:
            assert runner.is_alive()
    finally:
        collector.stop()
        runner.join(timeout=10)
    assert not runner.is_alive() and collector.metrics()[keys.GAMES_HELD_BACK] == 0
