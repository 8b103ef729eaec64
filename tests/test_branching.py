"""Branched games: TextArena envs deep-copy, G continuations share a group id, the buffer keeps groups whole."""

import copy
import json
import logging
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from unstable.agents.scripted import RandomAgent
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.collector import Collector
from unstable.collector.collector import RECORDS_ENV
from unstable.collector.config import CollectorConfig
from unstable.config import load_config
from unstable.games.agent import Agent
from unstable.games.branching import play_branched_episode, random_branch_turn
from unstable.games.episode import start_env
from unstable.games.moves import legal_moves
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import Decision, EnvSpec, GenerationResult, Step
from unstable.runtime import train
from unstable.tracking import Tracker, keys

from .runs import EXAMPLE, tiny_run

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
KUHN = EnvSpec("KuhnPoker-v0-train", 2, "qwen3-zs")  # three rounds: later deals draw on global `random`


class _Always(Agent):
    """Plays the first move the env offers (deterministic, so only chance can make games differ)."""

    name = "always"

    def act(self, observation):
        return Decision(action=legal_moves(observation)[0])


def test_deep_copied_envs_continue_independently():
    for spec, move in ((TICTACTOE, "[4]"), (KUHN, "[check]")):
        env = start_env(spec, seed=3)
        env.get_observation()
        twin = copy.deepcopy(env)
        twin.step(move)
        assert env.state.turn == 0 and twin.state.turn == 1  # the original did not move
        env.step(move)
        assert env.get_observation() == twin.get_observation()  # same state, same observation


def test_tictactoe_branches_share_a_group_id_and_continue_independently():
    agents = {0: RandomAgent(0), 1: RandomAgent(1)}
    records = play_branched_episode(
        TICTACTOE, agents, seed=5, group_size=4, branch_turn_selector=lambda seed: 2, learner_player_ids=(0,)
    )
    assert len(records) == 4 and not any(r.failed for r in records)
    branch_steps = [next(s for s in r.steps if s.group_id is not None) for r in records]
    assert {s.group_id for s in branch_steps} == {"TicTacToe-v0-train:5:2"}
    assert all(s.turn == 2 and s.player_id == 0 for s in branch_steps)  # the first learner decision at turn >= 2
    assert len({s.observation for s in branch_steps}) == 1  # the same copied state
    assert [s.turn for s in records[0].steps[:3]] == [0, 1, 2]  # the first record holds the whole game
    assert all(r.steps[0].turn == 2 for r in records[1:])  # the others start at the branch
    assert sum(s.group_id is not None for r in records for s in r.steps) == 4  # only the branch decisions
    assert len({tuple(s.action for s in r.steps[-4:]) for r in records}) > 1  # the copies diverged


def test_kuhn_branches_replay_the_same_chance_events():
    records = play_branched_episode(
        KUHN, {0: _Always(), 1: _Always()}, seed=7, group_size=3, branch_turn_selector=lambda seed: 1,
        learner_player_ids=(0, 1),
    )  # fmt: skip
    assert len(records) == 3
    continuations = [[s.observation for s in r.steps if s.turn >= 1] for r in records]
    assert continuations[0] == continuations[1] == continuations[2]  # same later deals in every copy
    assert records[0].rewards == records[1].rewards == records[2].rewards


class _Thinking(Agent):
    """A seeded random player that waits a moment before each move, as a model's generation does: the games of
    other threads step their envs meanwhile."""

    name = "thinking"

    def __init__(self, seed: int):
        self.random = RandomAgent(seed)

    def act(self, observation):
        time.sleep(0.001)
        return self.random.act(observation)


_DEAL = re.compile(r"Starting round (\d+) out of \d+ rounds\. Your card is: '([JQK])'")


def _deals(branches) -> dict[tuple[int, int], list[str]]:
    """(round, player) -> the card each branch that reached it saw dealt there; `branches` holds each branch's
    `(player_id, observation)` pairs."""
    seen: dict[tuple[int, int], list[str]] = {}
    for pairs in branches:
        dealt = {(int(round_), pid): card for pid, observation in pairs for round_, card in _DEAL.findall(observation)}
        for key, card in dealt.items():
            seen.setdefault(key, []).append(card)
    return seen


def _compared_and_split(deals: list[dict[tuple[int, int], list[str]]]) -> tuple[int, list]:
    """How many later-round deals several branches of a game saw, and (game, (round, player)) where they differ."""
    compared = sum(len(cards) > 1 for game in deals for (round_, _), cards in game.items() if round_ > 1)
    split = [(n, key) for n, game in enumerate(deals) for key, cards in game.items() if len(set(cards)) > 1]
    return compared, split


def _branched_kuhn(seed: int):
    agents = {pid: _Thinking(10 * seed + pid) for pid in (0, 1)}
    selector = lambda seed: 1  # noqa: E731 - the branch before round 1 ends: rounds 2 and 3 are dealt in each copy
    return play_branched_episode(KUHN, agents, seed, 4, branch_turn_selector=selector, learner_player_ids=(0, 1))


def test_kuhn_branches_see_the_same_deals_while_other_games_run():
    with ThreadPoolExecutor(max_workers=8) as pool:
        games = list(pool.map(_branched_kuhn, range(32)))
    assert all(not r.failed for records in games for r in records)
    deals = [_deals([(s.player_id, s.observation) for s in r.steps] for r in records) for records in games]
    compared, split = _compared_and_split(deals)
    assert compared > 32  # most games reach round 2 or 3 in several branches
    assert not split, f"the branches of a game saw different deals at (game, (round, player)) {split[:4]}"
    alone = _branched_kuhn(5)
    assert _deals([(s.player_id, s.observation) for s in r.steps] for r in alone) == deals[5]  # its seed decides


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
def test_kuhn_groups_see_the_same_deals_through_unstable_train(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))  # the collector writes every game's branches there
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "kuhn-groups",
        "collector.training_envs=[[KuhnPoker-v0-train, 2, qwen3-zs]]",
        "collector.group_size=4",
        "collector.num_workers=8",
        "learner.batch_size=8",
        "inference.max_new_tokens=8",
        "warm_start.games=16",  # enough supervised Kuhn moves that most games get past round 1
        "warm_start.epochs=2",
        "warm_start.learning_rate=3.0e-3",
    )
    train(load_config(EXAMPLE, overrides))
    games = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    groups = [records for records in games if len(records) == 4]  # the games that branched
    deals = [_deals([(s["player_id"], s["observation"]) for s in r["steps"]] for r in records) for records in groups]
    compared, split = _compared_and_split(deals)
    assert compared >= 4, f"too few groups reached round 2 in several branches: {len(groups)} groups"
    assert not split, f"the branches of a group saw different deals at (group, (round, player)) {split[:4]}"


def test_uncopyable_env_or_short_game_falls_back_to_one_plain_record(monkeypatch, caplog):
    agents = {0: RandomAgent(0), 1: RandomAgent(1)}
    late = play_branched_episode(TICTACTOE, agents, 1, 4, branch_turn_selector=lambda seed: 50, learner_player_ids=(0,))
    assert len(late) == 1 and not late[0].failed and all(s.group_id is None for s in late[0].steps)

    def refuse(*args, **kwargs):
        raise TypeError("cannot pickle '_thread.lock' object")

    monkeypatch.setattr(copy, "deepcopy", refuse)
    with caplog.at_level(logging.WARNING):
        records = play_branched_episode(TICTACTOE, agents, 1, 4, learner_player_ids=(0,))
    assert len(records) == 1 and not records[0].failed and records[0].rewards
    assert all(s.group_id is None for s in records[0].steps)
    assert "cannot deep-copy" in caplog.text


def test_random_branch_turn_is_deterministic_in_the_seed():
    select = random_branch_turn(window=6)
    assert select(11) == select(11) and {select(seed) for seed in range(50)} == set(range(6))


def _step(group_id=None):
    return Step("E", 0, 0, "o", "a", completion_token_ids=(1,), behaviour_logprobs=(0.0,), group_id=group_id)


def test_buffer_draws_whole_groups():
    buffer = StepBuffer(BufferConfig(max_buffer_size=64), seed=3)
    buffer.steps.extend(_step(f"g{i % 3}") for i in range(12))  # three groups of four, interleaved
    for _ in range(2):
        batch = buffer.get_batch(4)
        assert len({s.group_id for s in batch}) == 1
    buffer.steps.extend(_step() for _ in range(3))
    batch = buffer.get_batch(6)  # one group of 4 left and 3 lone steps: the group is drawn whole or not at all
    assert len(batch) == 6 and sum(s.group_id is not None for s in batch) in (3, 4)


class _FakeEngine:
    """Answers every request with a random legal TicTacToe move and made-up tokens."""

    def __init__(self):
        self.rng = random.Random(0)

    def generate(self, request):
        move = self.rng.choice(legal_moves(request.prompt))
        return GenerationResult(f"\\boxed{{{move}}}", (1, 2), (3,), (-0.5,))

    def end_game(self, game):
        pass


def test_collector_group_size_sends_every_branch_to_the_buffer(tmp_path):
    pool = ModelPool(PoolConfig(sample_mode="mirror"))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=256))
    cfg = CollectorConfig(training_envs=[TICTACTOE], group_size=3)
    collector = Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), cfg, seed=1)
    collector.play_one(is_eval=False)
    grouped = [s for s in buffer.steps if s.group_id is not None]
    assert len(grouped) == 3 and len({s.group_id for s in grouped}) == 1
    assert pool.games_played == 1  # ratings see one whole game
    assert buffer.metrics()[keys.BUFFER_GAMES_ADDED] == 3
