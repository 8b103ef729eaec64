"""Scripted agents played through the real TextArena envs: legality, optimality, seeded determinism; opponents
parsed from names and built into agents."""

from __future__ import annotations

import copy

import pytest
import textarena as ta

from unstable.agents.policy import PolicyAgent
from unstable.agents.scripted import (
    SCRIPTED_AGENTS,
    KuhnPokerNashAgent,
    NimOptimalAgent,
    RandomAgent,
    TicTacToeCenterAgent,
    TicTacToeMinimaxAgent,
    kuhn_infoset,
    make_scripted_agent,
)
from unstable.agents.seating import make_agent, parse_opponent
from unstable.games import tictactoe
from unstable.games.kuhn import INFOSETS, exploitability
from unstable.games.moves import legal_moves
from unstable.games.registry import make_env
from unstable.games.templates import get_template
from unstable.records import Checkpoint, Opponent
from unstable.tracking.stats import wilson_interval


def play(env_id: str, agents: dict, seed: int):
    """Play one game to the end; return (rewards, game_info) from env.close()."""
    env = ta.make(env_id)
    env.reset(num_players=2, seed=seed)
    done = False
    while not done:
        pid, observation = env.get_observation()
        done, _ = env.step(agents[pid].act(observation).action)
    return env.close()


def first_observation(env_id: str, moves: list[str]) -> str:
    """The observation of the player to act after `moves` (seed 0)."""
    env = ta.make(env_id)
    env.reset(num_players=2, seed=0)
    for move in moves:
        env.step(move)
    return env.get_observation()[1]


@pytest.mark.parametrize("env_id", ["TicTacToe-v0-train", "TicTacToe-v0"])
def test_legal_moves_tictactoe_reads_the_current_board(env_id):
    observation = first_observation(env_id, ["[4]", "[0]"])
    assert legal_moves(observation) == ["[1]", "[2]", "[3]", "[5]", "[6]", "[7]", "[8]"]


@pytest.mark.parametrize("env_id", ["KuhnPoker-v0-train", "KuhnPoker-v0"])
def test_legal_moves_kuhn_ignores_rules_and_past_moves(env_id):
    assert legal_moves(first_observation(env_id, [])) == ["[check]", "[bet]"]
    assert legal_moves(first_observation(env_id, ["[check]", "[bet]"])) == ["[fold]", "[call]"]


def test_legal_moves_nim_enumerates_the_last_piles():
    observation = first_observation("Nim-v0", ["[0 3]", "[1 2]"])  # piles now 0, 2, 5
    assert legal_moves(observation) == ["[1 1]", "[1 2]"] + [f"[2 {k}]" for k in range(1, 6)]


def test_legal_moves_empty_and_random_fallback():
    assert legal_moves("Say something nice.") == []
    decision = RandomAgent(seed=0).act("Say something nice.")
    assert decision.action == RandomAgent.FALLBACK_ACTION and not decision.format_ok


def minimax_results(env, agent, seat: int, results: list) -> None:
    """Depth-first over every legal opponent reply (copying env and agent at each branch point); append the
    final rewards of every complete game to `results`."""
    pid, observation = env.get_observation()
    if pid == seat:
        branches = [(env, agent, agent.act(observation).action)]
    else:
        board = env.state.game_state["board"]
        cells = [3 * r + c for r in range(3) for c in range(3) if board[r][c] == ""]
        branches = [(*copy.deepcopy((env, agent)), f"[{cell}]") for cell in cells]
    for branch_env, branch_agent, move in branches:
        done, _ = branch_env.step(move)
        if done:
            results.append(branch_env.close()[0])
        else:
            minimax_results(branch_env, branch_agent, seat, results)


@pytest.mark.slow
@pytest.mark.parametrize("seat", [0, 1])
@pytest.mark.parametrize("seed", [0, 1])
def test_minimax_never_loses_against_any_opponent(seat, seed):
    env = ta.make("TicTacToe-v0-train")
    env.reset(num_players=2, seed=seed)
    results = []
    minimax_results(env, TicTacToeMinimaxAgent(seed), seat, results)
    assert len(results) > 50  # many complete games were explored
    assert all(rewards[seat] >= 0 for rewards in results)
    assert any(rewards[seat] > 0 for rewards in results)  # and it punishes mistakes


def test_minimax_beats_or_draws_random():
    wins = 0
    for seed in range(20):
        for seat in (0, 1):
            agents = {seat: TicTacToeMinimaxAgent(seed), 1 - seat: RandomAgent(seed)}
            rewards, info = play("TicTacToe-v0-train", agents, seed)
            assert rewards[seat] >= 0 and not info[seat]["invalid_move"]
            wins += rewards[seat] > 0
    assert wins >= 25  # perfect play does not seek wins against random; 200 games per seat gave 92% and 78%


def test_minimax_takes_the_fastest_win():
    # O (to move) wins at once with cell 2; blocking X at 5 would win too, but later.
    observation = "Current Board:\n\n O | O | 2 \n---+---+---\n X | X | 5 \n---+---+---\n 6 | 7 | 8 \n"
    assert {TicTacToeMinimaxAgent(seed).act(observation).action for seed in range(10)} == {"[2]"}


def test_minimax_is_seeded():
    empty = first_observation("TicTacToe-v0-train", [])
    openings = [TicTacToeMinimaxAgent(seed).act(empty).action for seed in range(10)]
    assert openings == [TicTacToeMinimaxAgent(seed).act(empty).action for seed in range(10)]
    assert len(set(openings)) > 1  # every opening draws, so the seed picks among all nine


def test_minimax_epsilon_plays_a_random_empty_cell_that_often():
    # O wins at once with cell 2; with epsilon 1/2 about half the moves are any of the five empty cells instead
    observation = "Current Board:\n\n O | O | 2 \n---+---+---\n X | X | 5 \n---+---+---\n 6 | 7 | 8 \n"
    agent = make_scripted_agent("tictactoe-minimax:epsilon=1/2", seed=0)
    moves = [agent.act(observation).action for _ in range(400)]
    assert set(moves) == {"[2]", "[5]", "[6]", "[7]", "[8]"} and agent.name == "tictactoe-minimax:epsilon=1/2"
    low, high = wilson_interval(moves.count("[2]"), len(moves))
    assert low < 0.5 + 0.5 / 5 < high  # the best cell: half the moves, plus a fifth of the random ones
    assert make_scripted_agent("tictactoe-minimax:epsilon=0", seed=0).name == "tictactoe-minimax"
    with pytest.raises(ValueError, match="epsilon must be in"):
        make_scripted_agent("tictactoe-minimax:epsilon=2", seed=0)


def test_center_agent_opens_in_the_center_then_plays_legal_random_cells():
    empty, center_taken = (first_observation("TicTacToe-v0-train", moves) for moves in ([], ["[4]"]))
    assert {TicTacToeCenterAgent(seed).act(empty).action for seed in range(5)} == {"[4]"}
    replies = {TicTacToeCenterAgent(seed).act(center_taken).action for seed in range(40)}
    assert replies == {f"[{cell}]" for cell in range(9) if cell != 4}  # any other cell once the center is taken
    for seed in range(10):
        _, info = play("TicTacToe-v0-train", {0: TicTacToeCenterAgent(seed), 1: RandomAgent(seed)}, seed)
        assert not info[0]["invalid_move"]


@pytest.mark.parametrize("env_id", ["TicTacToe-v0-train", "KuhnPoker-v0-train", "Nim-v0-train", "ConnectFour-v0-train"])
def test_random_agents_never_make_invalid_moves(env_id):
    for seed in range(40):
        rewards, info = play(env_id, {0: RandomAgent(seed), 1: RandomAgent(seed + 1000)}, seed)
        assert set(rewards) == {0, 1}
        assert not any(player["invalid_move"] for player in info.values())


@pytest.mark.parametrize("env_id", ["Nim-v0-train", "Nim-v0-medium-train", "Nim-v0-large-train"])
def test_nim_optimal_is_legal_and_wins_every_won_start(env_id):
    for seed in range(30):
        for seat in (0, 1):
            agents = {seat: NimOptimalAgent(seed), 1 - seat: RandomAgent(seed)}
            rewards, info = play(env_id, agents, seed)
            assert not any(player["invalid_move"] for player in info.values())
            if seat == 0:  # all three starts have a non-zero nim-sum, so the opener can always win
                assert rewards[0] == 1


def test_nim_optimal_move_format():
    observation = first_observation("Nim-v0-train", [])  # piles 3, 4, 5: nim-sum 2, take 2 from pile 0
    assert NimOptimalAgent(0).act(observation).action == "[0 2]"


@pytest.mark.slow
def test_kuhn_infoset_across_rounds_and_empirical_frequencies():
    """Nash agent vs random through the real 3-round env: its parsed information set matches the env's true
    state in every round, and its bet/call frequency per information set matches the equilibrium."""
    agent = KuhnPokerNashAgent(seed=7)
    counts = {key: [0, 0] for key in agent.strategy}  # key -> [aggressive, total]
    for seed in range(300):
        env = ta.make("KuhnPoker-v0-train")
        env.reset(num_players=2, seed=seed)
        seat, opponent = seed % 2, RandomAgent(seed)
        done, history, round_number = False, "", 1
        while not done:
            state = env.state.game_state
            if state["current_round"] != round_number:
                history, round_number = "", state["current_round"]
            pid, observation = env.get_observation()
            if pid == seat:
                true_key = "JQK"[state["player_cards"][pid]] + history
                assert kuhn_infoset(observation) == true_key
                action = agent.act(observation).action
                counts[true_key][0] += action in ("[bet]", "[call]")
                counts[true_key][1] += 1
            else:
                action = opponent.act(observation).action
            history += {"[check]": "c", "[bet]": "b"}.get(action, "")
            done, _ = env.step(action)
        assert not any(player["invalid_move"] for player in env.close()[1].values())
    for key, (aggressive, total) in counts.items():
        low, high = wilson_interval(aggressive, total, z=3.3)
        assert total >= 40 and low <= agent.strategy[key] <= high, (key, aggressive, total)


def test_kuhn_nash_agent_alpha():
    agent = make_scripted_agent("kuhn-nash:alpha=0.25", seed=0)
    assert agent.strategy["K"] == 0.75 and agent.name == "kuhn-nash:alpha=1/4"
    with pytest.raises(ValueError, match="alpha"):
        KuhnPokerNashAgent(seed=0, alpha=0.5)


def test_kuhn_honest_agent_bets_and_calls_the_king_only_and_is_exploitable():
    agent = make_scripted_agent("kuhn-honest", seed=0)
    assert agent.strategy == {key: float(key[0] == "K") for key in INFOSETS}
    env = make_env("KuhnPoker-v0-single-train")
    env.reset(num_players=2, seed=0)
    _, observation = env.get_observation()
    card = kuhn_infoset(observation)[0]
    assert agent.act(observation).action == ("[bet]" if card == "K" else "[check]")
    assert exploitability(agent.strategy) == pytest.approx(1 / 4)  # a best response wins 1/6 first, 1/3 second


def test_make_scripted_agent_names_and_errors():
    for name, cls in SCRIPTED_AGENTS.items():
        assert type(make_scripted_agent(name, seed=3)) is cls
    with pytest.raises(ValueError) as error:
        make_scripted_agent("alphago", seed=0)
    assert all(name in str(error.value) for name in ["random", "tictactoe-minimax", "kuhn-nash", "nim-optimal"])
    with pytest.raises(ValueError, match="bad parameter"):
        make_scripted_agent("random:temperature=2", seed=0)


def test_parse_opponent_scripted_names_and_errors():
    assert parse_opponent("kuhn-nash:alpha=0.2") == Opponent("kuhn-nash:alpha=0.2", fixed="kuhn-nash:alpha=0.2")
    with pytest.raises(ValueError, match="a scripted agent .*random.* or an API model 'org/model'"):
        parse_opponent("alphago")
    with pytest.raises(ValueError, match="bad parameter"):
        parse_opponent("random:temperature=2")


def test_parse_opponent_directory_is_a_checkpoint_with_a_peft_safe_uid(tmp_path):
    adapter = tmp_path / "ckpt.v1"
    adapter.mkdir()
    opponent = parse_opponent(str(adapter))
    assert opponent.fixed is None and opponent.checkpoint == Checkpoint(uid=opponent.agent_id, path=str(adapter))
    assert opponent.agent_id.startswith("opponent-") and all(c.isalnum() or c in "_-" for c in opponent.agent_id)


def test_make_agent_builds_scripted_agents_by_seed_and_policy_agents_for_checkpoints():
    empty = first_observation("TicTacToe-v0-train", [])
    scripted = [make_agent(parse_opponent("random"), None, None, None, seed=s).act(empty).action for s in range(10)]
    assert scripted == [RandomAgent(seed).act(empty).action for seed in range(10)]
    template, checkpoint = get_template("qwen3-zs"), Checkpoint("opponent-x", path="x")
    agent = make_agent(Opponent("opponent-x", checkpoint=checkpoint), "client", template, "tokenizer", seed=0)
    assert isinstance(agent, PolicyAgent) and agent.checkpoint == checkpoint and agent.client == "client"
    assert agent.template is template and agent.tokenizer == "tokenizer" and agent.name == "opponent-x"


# O | O | 2      O (to move) wins at 2; X threatens 5
# X | X | 5
# 6 | 7 | 8
TWO_THREATS = "Current Board:\n\n O | O | 2 \n---+---+---\n X | X | 5 \n---+---+---\n 6 | 7 | 8 \n"
# X threatens 2, O has no win: O (to move) must block; the center is free
ONE_THREAT = "Current Board:\n\n X | X | 2 \n---+---+---\n O | 4 | 5 \n---+---+---\n 6 | 7 | O \n"
EMPTY = "Current Board:\n\n 0 | 1 | 2 \n---+---+---\n 3 | 4 | 5 \n---+---+---\n 6 | 7 | 8 \n"


@pytest.mark.parametrize(
    ("name", "two_threats", "one_threat", "empty"),
    [
        ("tictactoe-win", {"[2]"}, "random", "random"),
        ("tictactoe-win-center", {"[2]"}, {"[4]"}, {"[4]"}),
        ("tictactoe-win-block", {"[2]"}, {"[2]"}, "random"),
        ("tictactoe-win-block-center", {"[2]"}, {"[2]"}, {"[4]"}),
        ("tictactoe-center", "random", {"[4]"}, {"[4]"}),
    ],
)
def test_rule_agents_win_then_block_then_take_the_center_as_named(name, two_threats, one_threat, empty):
    """Each rule agent plays its rule's cell whatever its seed, and any empty cell where no rule applies."""
    for observation, expected in [(TWO_THREATS, two_threats), (ONE_THREAT, one_threat), (EMPTY, empty)]:
        moves = {make_scripted_agent(name, seed).act(observation).action for seed in range(40)}
        empty_cells = {f"[{cell}]" for cell in tictactoe.empty_cells(tictactoe.read_board(observation))}
        assert moves == (empty_cells if expected == "random" else expected), (name, observation)


@pytest.mark.parametrize(
    "name", ["tictactoe-win", "tictactoe-win-center", "tictactoe-win-block", "tictactoe-win-block-center"]
)
def test_rule_agents_play_legal_games_in_either_seat_and_beat_random_more_often_than_not(name):
    wins = 0
    for seed in range(20):
        for seat in (0, 1):
            agents = {seat: make_scripted_agent(name, seed), 1 - seat: RandomAgent(seed)}
            rewards, info = play("TicTacToe-v0-train", agents, seed)
            assert not any(player["invalid_move"] for player in info.values())
            wins += rewards[seat] > 0
    assert wins > 20  # of 40: each wins 0.67 or more against random (benchmarks/tictactoe_heuristics.py)
