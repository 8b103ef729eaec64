"""Vines: Monte Carlo continuations from a game's learner decisions, one group per vined move, a baseline per group."""

import copy
import json
import logging

import pytest

from unstable.agents.scripted import RandomAgent
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.buffer.step_buffer import steps_to_add
from unstable.collector import Collector
from unstable.collector.collector import RECORDS_ENV
from unstable.collector.config import CollectorConfig
from unstable.collector.vine_stats import VineStats
from unstable.config import ConfigError, load_config
from unstable.games.agent import Agent
from unstable.games.vines import VineConfig, play_vined_episode, vine_returns
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import Decision, EnvSpec, GameRecord, Opponent, Step
from unstable.rewards import BaselineByGroup
from unstable.runtime import train
from unstable.tracking import Tracker, keys

from .runs import EXAMPLE, tiny_run
from .test_branching import KUHN, _deals, _FakeEngine, _Thinking

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")


class _Tokens(Agent):
    """A seeded random TicTacToe player whose every move 'generated' `tokens` tokens."""

    name = "tokens"

    def __init__(self, seed: int, tokens: int = 2):
        self.random = RandomAgent(seed)
        self.tokens = tokens

    def act(self, observation):
        return Decision(action=self.random.act(observation).action, completion_token_ids=(7,) * self.tokens)


def _agents(seed=0):
    return {0: _Tokens(seed), 1: _Tokens(seed + 1)}


def _learner_turns(record: GameRecord) -> list[int]:
    return [s.turn for s in record.steps if s.player_id in record.learner_player_ids]


def test_every_learner_decision_gets_its_vines_sharing_its_group():
    records = play_vined_episode(TICTACTOE, _agents(), 5, VineConfig(rollouts=3), learner_player_ids=(0,))
    game, vines = records[0], records[1:]
    turns = _learner_turns(game)
    assert game.vine_turn is None and len(vines) == 3 * len(turns) and not any(r.failed for r in records)
    for turn in turns:
        grown = [v for v in vines if v.vine_turn == turn]
        assert len(grown) == 3 and all(v.steps[0].turn == turn for v in grown)  # each starts at its branch
        group = {s.group_id for v in grown for s in v.steps if s.group_id} | {game.steps[turn].group_id}
        assert group == {f"TicTacToe-v0-train:5:{turn}"}
        assert len({v.steps[0].observation for v in grown} | {game.steps[turn].observation}) == 1  # one state
    assert all(sum(s.group_id is not None for s in v.steps) == 1 for v in vines)  # only the branch decision
    assert all(steps_to_add(v) == 1 for v in vines)  # the buffer trains on a vine's first move alone
    assert steps_to_add(game) == len(turns)
    assert len({tuple(s.action for s in v.steps) for v in vines if v.vine_turn == turns[0]}) > 1  # they diverge


def test_window_budget_and_spread_choose_the_decisions():
    window = play_vined_episode(
        TICTACTOE, _agents(), 5, VineConfig(rollouts=2, decisions="window", first_turn=2, last_turn=4),
        learner_player_ids=(0,),
    )  # fmt: skip
    assert {v.vine_turn for v in window[1:]} == {2, 4}
    # the game generates 2 tokens a turn: a vine from turn t is expected to cost 2 x (turns from t on)
    game = window[0]
    cost = {t: 2 * (len(game.steps) - t) for t in _learner_turns(game)}
    budget = 2 * cost[0] + 1
    capped = play_vined_episode(
        TICTACTOE, _agents(), 5, VineConfig(rollouts=2, max_tokens_per_game=budget), learner_player_ids=(0,)
    )
    assert [v.vine_turn for v in capped[1:]] == [0, 0]  # the first decision's two vines fill the budget
    spread = play_vined_episode(
        TICTACTOE, _agents(), 5, VineConfig(rollouts=4, decisions="spread"), learner_player_ids=(0,)
    )
    returns = vine_returns(spread)
    for values in returns.values():  # one probe; three more only where the probe's return was not the game's
        assert len(values) in (2, 5)
        assert (len(values) == 5) == (values[0] != values[1])


def test_fixed_chance_repeats_the_deals_and_resample_draws_new_ones():
    def deals(chance):
        records = play_vined_episode(
            KUHN, {0: _Thinking(1), 1: _Thinking(2)}, 7, VineConfig(rollouts=6, chance=chance),
            learner_player_ids=(0, 1),
        )  # fmt: skip
        from_turn_1 = [r for r in records[1:] if r.vine_turn == 1]
        return _deals([(s.player_id, s.observation) for s in r.steps] for r in [records[0], *from_turn_1])

    later = lambda seen: {key: cards for key, cards in seen.items() if key[0] > 1}  # noqa: E731 - rounds 2 and 3
    assert all(len(set(cards)) == 1 for cards in later(deals("fixed")).values())
    assert any(len(set(cards)) > 1 for cards in later(deals("resample")).values())


def test_an_env_that_cannot_be_copied_plays_on_without_vines(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise TypeError("cannot pickle '_thread.lock' object")

    monkeypatch.setattr(copy, "deepcopy", refuse)
    with caplog.at_level(logging.WARNING):
        records = play_vined_episode(TICTACTOE, _agents(), 5, VineConfig(rollouts=3), learner_player_ids=(0,))
    assert len(records) == 1 and not records[0].failed and records[0].rewards
    assert all(s.group_id is None for s in records[0].steps) and "cannot deep-copy" in caplog.text


def test_baseline_by_group_is_each_moves_return_minus_the_others_mean():
    def step(reward, group=None, env="E"):
        return Step(env, 0, 0, "o", "a", reward=reward, group_id=group)

    steps = [step(1.0, "g"), step(-1.0, "g"), step(0.0, "g"), step(1.0), step(0.0), step(5.0, "lone")]
    out = [s.reward for s in BaselineByGroup()(steps)]
    assert out[:3] == [1.0 - (-0.5), -1.0 - 0.5, 0.0 - 0.0]  # leave-one-out means of the group
    assert out[3:] == [1.0 - 2.0, 0.0 - 2.0, 5.0 - 2.0]  # alone: their env's mean over such steps


def test_each_vined_move_carries_the_value_of_the_state_it_led_to():
    """VinePPO's estimate: a game move's `value_after` is the mean return of the game and its vines at the same
    player's next vined decision; the player's last move has none (its return is the game's own)."""
    records = play_vined_episode(TICTACTOE, _agents(), 5, VineConfig(rollouts=3), learner_player_ids=(0,))
    game, returns = records[0], vine_returns(records)
    turns = _learner_turns(game)
    for turn, next_turn in zip(turns, turns[1:]):
        assert game.steps[turn].value_after == pytest.approx(sum(returns[next_turn]) / len(returns[next_turn]))
    assert game.steps[turns[-1]].value_after is None
    assert all(s.value_after is None for s in game.steps if s.player_id != 0)
    assert all(s.value_after is None for v in records[1:] for s in v.steps)  # vines keep their own returns


def test_bootstrapped_baseline_scores_a_game_move_by_the_value_it_led_to():
    def step(reward, value_after=None):
        return Step("E", 0, 0, "o", "a", reward=reward, group_id="g", value_after=value_after)

    steps = [step(1.0, value_after=0.5), step(0.0), step(1.0)]  # the game's move (it won), two vines' moves
    assert [s.reward for s in BaselineByGroup()(steps)] == [1.0 - 0.5, 0.0 - 1.0, 1.0 - 0.5]
    assert [s.reward for s in BaselineByGroup(bootstrap=True)(steps)] == [0.5 - 0.5, 0.0 - 0.75, 1.0 - 0.25]
    with pytest.raises(ValueError, match="bootstrap"):
        BaselineByGroup(bootstrap="yes")


def test_baseline_by_action_pools_the_returns_of_the_same_move_in_one_state():
    """With `by_action` a move's value is the mean return of its group's moves that chose the same action (a Monte
    Carlo Q of that action), less the leave-one-out mean of the others' returns."""

    def step(action, reward, group="g"):
        return Step("E", 0, 0, "o", action, reward=reward, group_id=group)

    steps = [step("[4]", 1.0), step("[4]", 0.0), step("[0]", 1.0), step("[8]", -1.0), step("[4]", 1.0, "h")]
    out = [s.reward for s in BaselineByGroup(by_action=True)(steps)]
    assert out[:4] == pytest.approx([0.5 - 0.0, 0.5 - 1 / 3, 1.0 - 0.0, -1.0 - 2 / 3])
    assert out[4] == 0.0  # alone in its group: its env's mean over such steps (only itself here), as before
    with pytest.raises(ValueError, match="by_action"):
        BaselineByGroup(by_action=1)


def test_vine_stats_measure_cost_share_and_spread():
    stats = VineStats()
    records = play_vined_episode(TICTACTOE, _agents(), 5, VineConfig(rollouts=3), learner_player_ids=(0,))
    stats.add(records)
    row = stats.take()
    game, vines = records[0], records[1:]
    vine_tokens = sum(2 * len(v.steps) for v in vines)
    learner_tokens = 2 * (len(_learner_turns(game)) + len(vines))
    assert row[keys.VINE_TOKENS_PER_LEARNER_TOKEN] == pytest.approx(vine_tokens / learner_tokens)
    assert row[keys.VINED_MOVE_SHARE] == 1.0
    assert row[keys.VINE_VALUE_SPREAD] >= 0 and 0 <= row[keys.VINE_RETURN_SPREAD] <= 1
    assert stats.take()[keys.VINED_MOVE_SHARE] == 0.0  # taken: the next row starts afresh


def test_collector_sends_vines_to_the_buffer_and_one_game_to_the_ratings(tmp_path):
    pool = ModelPool(PoolConfig(sample_mode="mirror"))
    pool.add_checkpoint(path=None, iteration=-1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=512))
    cfg = CollectorConfig(training_envs=[TICTACTOE], vines=VineConfig(rollouts=2))
    collector = Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), cfg, seed=1)
    game = collector.play_one(is_eval=False)
    assert pool.games_played == 1 and game.vine_turn is None
    groups = {s.group_id for s in buffer.steps}
    assert len(groups) == len(game.steps) and all(groups)  # mirror: every move is the learner's and got vines
    assert buffer.size() == 3 * len(game.steps)  # each move and its two vines' first moves
    assert collector.metrics()[keys.VINED_MOVE_SHARE] == 1.0


def test_games_against_an_api_model_grow_no_vines(tmp_path):
    pool = ModelPool(PoolConfig(sample_mode="mirror"))
    pool.add_checkpoint(path=None, iteration=-1)
    cfg = CollectorConfig(training_envs=[TICTACTOE], vines=VineConfig(rollouts=2))
    buffer = StepBuffer(BufferConfig(max_buffer_size=64))
    collector = Collector(_FakeEngine(), pool, buffer, Tracker(tmp_path), cfg, seed=1)
    agents, scripted = _agents(), [Opponent("random", fixed="random")]
    assert len(collector._play(TICTACTOE, agents, 3, False, (0,), scripted)) > 1
    api = [Opponent("api:org/model", api_model="org/model")]  # each vine move would be a paid request
    assert len(collector._play(TICTACTOE, agents, 3, False, (0,), api)) == 1


def test_vines_and_branching_together_are_refused():
    with pytest.raises(ConfigError, match="either branches once"):
        load_config(EXAMPLE, ["collector.group_size=2", "collector.vines.rollouts=2"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "decisions", "chance", "baseline_args"),
    [("reinforce", "spread", "fixed", "{by_action: true}"), ("ppo", "all", "resample", "{bootstrap: true}")],
)
@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_vines_train_through_unstable_train(
    tiny_model_dir, tmp_path, monkeypatch, algorithm, decisions, chance, baseline_args
):
    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "vines",
        "collector.vines.rollouts=2",
        f"collector.vines.decisions={decisions}",
        f"collector.vines.chance={chance}",
        f"learner.algorithm.name={algorithm}",
        "learner.algorithm.args={}",
        "learner.num_steps=2",
        "learner.batch_size=8",
        f"buffer.sampling_reward_transforms=[{{name: BaselineByGroup, args: {baseline_args}}}, "
        "{name: NormalizeRewardsByEnv}]",
        "warm_start.games=16",
    )
    train(load_config(EXAMPLE, overrides))
    games = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert any(len(records) > 1 for records in games)  # some games grew vines
    assert all(r["vine_turn"] is not None for records in games for r in records[1:])
    rows = [json.loads(line) for line in (tmp_path / "vines" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if keys.VINED_MOVE_SHARE in row]
    assert steps and max(row[keys.VINED_MOVE_SHARE] for row in steps) > 0
    assert sorted(row[keys.STEP] for row in rows if keys.STEP in row) == [0, 1, 2]  # each step logged once
