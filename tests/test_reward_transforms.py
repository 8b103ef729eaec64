"""Reward transforms with hand-computed numbers, the registry, and seed 002's three-stage pipeline end to end."""

import inspect
import math
from dataclasses import replace

import pytest

import unstable.reward_transformations as retra
from unstable.buffer import StepBuffer, step_buffer
from unstable.buffer.config import BufferConfig, RewardStages, TransformConfig
from unstable.records import GameRecord, Step, link_decisions


def _step(pid=0, reward=0.0, env_id="TicTacToe-v0-train", format_ok=True, invalid_move=False):
    return Step(
        env_id=env_id,
        player_id=pid,
        turn=0,
        observation="o",
        action="[1]",
        completion_token_ids=(5,),
        behaviour_logprobs=(-0.5,),
        format_ok=format_ok,
        invalid_move=invalid_move,
        reward=reward,
    )


def test_role_advantage_formatter_subtracts_an_ema_per_role_updated_first():
    fmt = retra.RoleAdvantageFormatter(tau=0.5)
    game = {0: 1.0, 1: -1.0}
    assert fmt(game) == {0: 0.5, 1: -0.5}  # b = 0.5 * 0 + 0.5 * r
    assert fmt(game, env_id="Other") == {0: 0.25, 1: -0.25}  # b = 0.75 / -0.75, whatever the env
    assert game == {0: 1.0, 1: -1.0}  # the input is untouched


def test_role_advantage_by_env_keeps_one_baseline_per_env_and_role():
    fmt = retra.RoleAdvantageByEnvFormatter(tau=0.5)
    assert fmt({0: 1.0, 1: -1.0}, env_id="A") == {0: 0.5, 1: -0.5}
    assert fmt({0: 1.0, 1: -1.0}, env_id="B") == {0: 0.5, 1: -0.5}  # B starts from 0
    assert fmt({0: -1.0, 1: 1.0}, env_id="A") == {0: -0.75, 1: 0.75}  # b_A = (0.5 - 1) / 2 = -0.25
    assert fmt.baselines == {("A", 0): -0.25, ("A", 1): 0.25, ("B", 0): 0.5, ("B", 1): -0.5}
    assert retra.RoleAdvantageByEnvFormatter().tau == 0.001  # the seed's default


def test_reward_for_format_adds_reward_or_penalty():
    step = _step(reward=1.0)
    assert retra.RewardForFormat(1.5)(step).reward == 2.5
    assert retra.RewardForFormat(1.5)(_step(reward=1.0, format_ok=False)).reward == 1.0  # penalty 0 by default
    assert retra.RewardForFormat(1.0, -0.5)(_step(reward=1.0, format_ok=False)).reward == 0.5
    assert step.reward == 1.0  # a new step, not an edit


def test_penalty_for_invalid_move_reads_seed_002_as_reward_then_penalty():
    transform = retra.PenaltyForInvalidMove(1.0, -1.0)
    assert transform(_step(reward=-1.0)).reward == 0.0  # valid move: +1
    assert transform(_step(reward=-1.0, invalid_move=True)).reward == -2.0  # invalid move: -1


def test_normalize_rewards_by_env_per_env_mean_and_optional_std():
    steps = [_step(reward=r, env_id=e) for r, e in [(1, "A"), (0, "B"), (3, "A"), (0, "B"), (6, "B")]]
    centred = retra.NormalizeRewardsByEnv(False)(steps)
    assert [s.reward for s in centred] == [-1.0, -2.0, 1.0, -2.0, 4.0]  # means: A 2, B 2
    z = retra.NormalizeRewardsByEnv(True)(steps)
    std_b = math.sqrt(8)  # population std of (0, 0, 6)
    assert [s.reward for s in z] == pytest.approx([-1.0, -2 / std_b, 1.0, -2 / std_b, 4 / std_b])
    assert [s.env_id for s in z] == ["A", "B", "A", "B", "B"]  # order kept
    assert [s.reward for s in steps] == [1, 0, 3, 0, 6]  # inputs untouched
    assert retra.NormalizeRewardsByEnv(True)([_step(reward=2.0)])[0].reward == 0.0  # a lone step: 0, no NaN


def test_normalize_rewards_by_opponent_keeps_one_mean_and_std_per_env_and_opponent():
    rows = [(1, "A", "random"), (-1, "A", "minimax"), (-1, "A", "random"), (0, "A", "minimax"), (1, "B", "random")]
    steps = [replace(_step(reward=r, env_id=e), opponent=o) for r, e, o in rows]
    centred = retra.NormalizeRewardsByOpponent(False)(steps)
    assert [s.reward for s in centred] == [1.0, -0.5, -1.0, 0.5, 0.0]  # means: random 0, minimax -0.5, B alone
    z = retra.NormalizeRewardsByOpponent(True)(steps)
    assert [s.reward for s in z] == pytest.approx([1.0, -1.0, -1.0, 1.0, 0.0])  # stds: random 1, minimax 0.5
    assert [s.reward for s in steps] == [r for r, _, _ in rows]  # inputs untouched


def test_by_role_gives_each_seat_its_own_mean_and_std():
    random_games = [(1, 0, "random"), (1, 0, "random"), (1, 1, "random"), (-1, 1, "random")]
    rows = [*random_games, (-1, 0, "minimax"), (0, 0, "minimax")]  # (reward, seat, opponent)
    steps = [replace(_step(pid, reward=r), opponent=o) for r, pid, o in rows]
    by_env = retra.NormalizeRewardsByEnv(False, by_role=True)(steps)
    assert [s.reward for s in by_env] == pytest.approx([0.75, 0.75, 1.0, -1.0, -1.25, -0.25])  # seat 0 mean 0.25
    z = retra.NormalizeRewardsByOpponent(True, by_role=True)(steps)
    # random seat 0: both won, std 0, so 0; random seat 1: +-1; minimax seat 0: mean -0.5, std 0.5
    assert [s.reward for s in z] == pytest.approx([0.0, 0.0, 1.0, -1.0, -1.0, 1.0])
    assert [s.reward for s in steps] == [r for r, _, _ in rows]  # inputs untouched


def test_by_turn_gives_each_turn_its_own_mean_and_std():
    # the opening's small differences (discounted far from the end) get the endgame's scale
    rows = [(0.1, 0), (-0.1, 0), (0.8, 4), (-0.8, 4), (0.0, 4)]  # (reward, turn)
    steps = [replace(_step(0, reward=r), turn=t) for r, t in rows]
    z = retra.NormalizeRewardsByEnv(True, by_turn=True)(steps)
    per_turn_4 = 0.8 / math.sqrt(2 * 0.64 / 3)
    assert [s.reward for s in z] == pytest.approx([1.0, -1.0, per_turn_4, -per_turn_4, 0.0])
    with pytest.raises(ValueError, match="by_turn"):
        retra.NormalizeRewardsByEnv(True, by_turn="yes")


def test_by_group_gives_each_vine_group_its_own_mean_and_std():
    # a decision whose moves differ by little (a Queen facing a bet) gets the scale of one that differs by much
    rows = [(0.3, "q"), (-0.1, "q"), (3.0, "k"), (-1.0, "k"), (1.0, None), (-1.0, None)]  # (advantage, group)
    steps = [replace(_step(0, reward=r), group_id=g) for r, g in rows]
    z = retra.NormalizeRewardsByEnv(True, by_group=True)(steps)
    assert [s.reward for s in z] == pytest.approx([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])  # no group: the env's own
    with pytest.raises(ValueError, match="by_group"):
        retra.NormalizeRewardsByEnv(True, by_group=1)


def test_the_buffer_names_each_steps_opponent_from_the_game_record():
    buffer = StepBuffer(BufferConfig(max_buffer_size=10), stages=RewardStages())
    steps = (_step(0), _step(1), _step(0))
    players = {0: "ckpt-3", 1: "random"}
    buffer.add_game(GameRecord("TicTacToe-v0-train", 0, players, steps, {0: 1, 1: -1}, learner_player_ids=(0,)))
    three, players = (_step(0), _step(1), _step(2)), {0: "x", 1: "y", 2: "z"}
    buffer.add_game(GameRecord("Poker", 0, players, three, {0: 1, 1: 0, 2: -1}, learner_player_ids=(1,)))
    assert [s.opponent for s in buffer.steps] == ["random", "random", "x+z"]


def test_baseline_by_observation_is_leave_one_out_per_state_else_the_env_mean():
    rewards = [(2.0, "J"), (-1.0, "J"), (5.0, "J"), (1.0, "K"), (3.0, "Q")]
    steps = [replace(_step(reward=r), observation=o) for r, o in rewards]
    out = retra.BaselineByObservation()(steps)
    env_mean = sum(r for r, _ in rewards) / len(rewards)  # 2.0
    # J: each minus the mean of the other two J steps; K and Q are alone, so their env's batch mean
    assert [s.reward for s in out] == pytest.approx([2 - 2, -1 - 3.5, 5 - 0.5, 1 - env_mean, 3 - env_mean])
    assert [s.reward for s in steps] == [r for r, _ in rewards]  # inputs untouched


def test_registry_builds_every_transform_and_config_accepts_their_names():
    expected = {
        "WinDrawLossFormatter",
        "RoleAdvantageFormatter",
        "RoleAdvantageByEnvFormatter",
        "RewardForFormat",
        "PenaltyForInvalidMove",
        "NormalizeRewardsByEnv",
        "NormalizeRewardsByOpponent",
        "BaselineByObservation",
        "BaselineByGroup",
        "DiscountLaterDecisions",
    }
    assert set(retra.TRANSFORMS) == expected
    assert retra.build_transform("PenaltyForInvalidMove", {"reward": 1.0, "penalty": -1.0}).penalty == -1.0
    assert retra.build_transform("NormalizeRewardsByEnv", {"z_score": True}).z_score
    for name in expected - {"DiscountLaterDecisions"}:
        TransformConfig(name=name)
    TransformConfig(name="DiscountLaterDecisions", args={"discount": 0.9})  # the one without a default
    with pytest.raises(ValueError, match="RewardForFormat"):
        retra.build_transform("RewardForFormats")


def test_seed_002_pipeline_end_to_end_in_the_buffer():
    buffer = StepBuffer(
        BufferConfig(max_buffer_size=10),
        stages=RewardStages(
            final=retra.ComposeFinalRewardTransforms([retra.RoleAdvantageByEnvFormatter()]),
            step=retra.ComposeStepRewardTransforms(
                [retra.RewardForFormat(1.5), retra.PenaltyForInvalidMove(1.0, -1.0)]
            ),
            sampling=retra.ComposeSamplingRewardTransforms([retra.NormalizeRewardsByEnv(True)]),
        ),
    )
    steps = (_step(0), _step(1), _step(0, format_ok=False), _step(1, invalid_move=True))
    buffer.add_game(
        GameRecord("TicTacToe-v0-train", 0, {0: "a", 1: "b"}, steps, {0: 1, 1: -1}, learner_player_ids=(0, 1))
    )
    # final: 1 - 0.001 = 0.999 and -1 + 0.001 = -0.999; step: +1.5 if format ok, +1 valid / -1 invalid
    stored = sorted(s.reward for s in buffer.steps)
    assert stored == pytest.approx([-0.999 + 1.5 - 1.0, -0.999 + 2.5, 0.999 + 1.0, 0.999 + 2.5])
    mean = sum(stored) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in stored) / 4)
    batch = sorted(s.reward for s in buffer.get_batch(4))
    assert batch == pytest.approx([(r - mean) / std for r in stored])


def _game(steps):
    return GameRecord("TicTacToe-v0-train", 0, {0: "a", 1: "b"}, steps, {0: 1, 1: -1}, learner_player_ids=(0, 1))


def test_link_decisions_counts_each_players_later_decisions_and_names_its_next_prompt():
    steps = tuple(replace(_step(pid), turn=turn, prompt_token_ids=(turn,)) for turn, pid in enumerate([0, 1, 0, 1, 0]))
    linked = link_decisions(steps)
    # player 0 decides at turns 0, 2, 4; player 1 at 1, 3; a player's last decision has no next prompt
    assert [s.decisions_after for s in linked] == [2, 1, 1, 0, 0]
    assert [s.next_prompt_token_ids for s in linked] == [(2,), (3,), (4,), (), ()]
    assert [s.decisions_after for s in steps] == [0] * 5  # new steps, the game's own untouched


def test_each_step_in_the_buffer_carries_its_players_next_decision_prompt():
    steps = tuple(replace(_step(pid), turn=turn, prompt_token_ids=(turn,)) for turn, pid in enumerate([0, 1, 0, 1, 0]))
    buffer = StepBuffer(BufferConfig(max_buffer_size=10), stages=RewardStages())
    buffer.add_game(_game(steps))
    assert [s.next_prompt_token_ids for s in buffer.steps] == [(2,), (3,), (4,), (), ()]
    assert [s.reward for s in buffer.steps] == [1, -1, 1, -1, 1]  # no discount unless configured


DISCOUNTED = [0.25, -0.25, 0.5, -1.5, -1.0, 1.0]  # see the next test


def test_discount_scales_each_move_by_its_players_later_moves_before_the_other_step_transforms():
    stage = [retra.DiscountLaterDecisions(0.5), retra.PenaltyForInvalidMove(0.0, -1.0)]
    buffer = StepBuffer(
        BufferConfig(max_buffer_size=10), stages=RewardStages(step=retra.ComposeStepRewardTransforms(stage))
    )
    buffer.add_game(_game((_step(0), _step(1), _step(0), _step(1, invalid_move=True), _step(1), _step(0))))
    # player 0 moved 3 times: 0.25, 0.5, 1; player 1 three times: -0.25, -0.5 - 1 (its rejected move), -1
    assert [s.reward for s in buffer.steps] == DISCOUNTED


def _rewards_under(buffer_settings: dict) -> list[float]:
    buffer = StepBuffer(BufferConfig(max_buffer_size=10, **buffer_settings))
    buffer.add_game(_game((_step(0), _step(1), _step(0), _step(1, invalid_move=True), _step(1), _step(0))))
    return [s.reward for s in buffer.steps]


def test_an_old_config_with_buffer_discount_gives_the_rewards_of_the_transform_placed_first():
    penalty = {"name": "PenaltyForInvalidMove", "args": {"penalty": -1.0}}
    discount = {"name": "DiscountLaterDecisions", "args": {"discount": 0.5}}
    old = {"discount": 0.5, "step_reward_transforms": [penalty]}
    assert _rewards_under(old) == _rewards_under({"step_reward_transforms": [discount, penalty]}) == DISCOUNTED
    assert BufferConfig(**old) == BufferConfig(step_reward_transforms=[discount, penalty])
    assert BufferConfig(discount=1.0) == BufferConfig()  # every saved run's config.yaml has it: dropped
    assert "discount" not in BufferConfig(**old).model_dump()


@pytest.mark.parametrize("discount", [0.0, -0.5, 1.5, "high"])
def test_a_discount_outside_zero_to_one_is_refused(discount):
    with pytest.raises(ValueError, match="discount"):
        retra.DiscountLaterDecisions(discount)
    with pytest.raises(ValueError, match="discount"):
        BufferConfig(discount=discount)


def test_the_step_buffer_knows_nothing_of_discounts():
    assert "discount" not in inspect.signature(StepBuffer).parameters
    assert "discount" not in inspect.getsource(step_buffer).lower()
