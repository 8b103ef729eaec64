"""Games: action extraction, templates, env-id validation and `play_episode` with real TextArena envs."""

import copy
import logging
import random
import threading
import time
from random import shuffle as random_shuffle

import numpy as np
import pytest

from unstable.agents.scripted import RandomAgent, make_scripted_agent
from unstable.games import extract_action, get_template, play_episode, validate_env_id
from unstable.games.agent import Agent
from unstable.games.chance import OwnRandomEnv
from unstable.games.registry import make_env
from unstable.records import Decision, EnvSpec

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")


@pytest.mark.parametrize(
    ("text", "action", "ok"),
    [
        ("I think... \\boxed{[4]}", "[4]", True),
        ("\\boxed{4}", "[4]", True),
        ("first \\boxed{[1]} then \\boxed{[7]}", "[7]", True),
        ("I play [3] now", "[3]", True),
        ("\\boxed{bet}", "[bet]", True),
        ("no idea at all", "no idea at all", False),
        ("", "", False),
    ],
)
def test_extract_action(text, action, ok):
    assert extract_action(text) == (action, ok)


def test_templates_render_and_unknown_names_fail():
    prompt = get_template("qwen3-zs").render("board here")
    assert prompt.startswith("<|im_start|>user") and "board here" in prompt and prompt.endswith("assistant\n")
    assert get_template("plain").render("obs").startswith("obs")
    with pytest.raises(ValueError, match="valid: \\['default', 'plain', 'qwen3-zs'\\]"):
        get_template("chatml")


def test_unknown_env_id_names_close_matches():
    assert validate_env_id("TicTacToe-v0-train") == "TicTacToe-v0-train"
    with pytest.raises(ValueError, match="TicTacToe-v0-train"):
        validate_env_id("TicTacToe-v0-trian")


# TextArena's Player 1 opens the hand; each sequence ends with the pot going to the shown player (None: the
# higher card), and the chips each player put in: ante 1, plus 1 for a bet or a call.
KUHN_SEQUENCES = {
    ("[check]", "[check]"): (None, {0: 1, 1: 1}),
    ("[check]", "[bet]", "[fold]"): (0, {0: 2, 1: 1}),
    ("[check]", "[bet]", "[call]"): (None, {0: 2, 1: 2}),
    ("[bet]", "[fold]"): (1, {0: 1, 1: 2}),
    ("[bet]", "[call]"): (None, {0: 2, 1: 2}),
}


@pytest.mark.parametrize("moves", list(KUHN_SEQUENCES))
def test_single_hand_kuhn_poker_rewards_the_chips_won(moves):
    assert validate_env_id("KuhnPoker-v0-single-train") == "KuhnPoker-v0-single-train"
    for seed in range(6):  # covers several deals
        env = make_env("KuhnPoker-v0-single-train")
        env.reset(num_players=2, seed=seed)
        cards = dict(env.state.game_state["player_cards"])  # wrappers pass attributes through
        for move in moves:
            done, _ = env.step(move)
        assert done
        rewards, _ = env.close()
        winner, put_in = KUHN_SEQUENCES[moves]
        winner = winner if winner is not None else max(cards, key=cards.get)
        pot = sum(put_in.values())
        assert rewards == {pid: (pot if pid == winner else 0) - put_in[pid] for pid in (0, 1)}


def test_full_game_between_two_random_agents():
    record = play_episode(TICTACTOE, {0: RandomAgent(1), 1: RandomAgent(2)}, seed=3, learner_player_ids=(0,))
    assert not record.failed and not record.truncated
    assert sorted(record.rewards) == [0, 1]
    assert len(record.steps) >= 5
    assert [s.player_id for s in record.steps[:2]] == [0, 1]
    assert all(not s.invalid_move for s in record.steps)
    assert record.outcome(0) in {"win", "draw", "loss"}


class _Garbage(Agent):
    name = "garbage"

    def act(self, observation):
        return Decision(action="I refuse to play", format_ok=False)


def test_malformed_output_becomes_invalid_moves_and_a_loss():
    record = play_episode(TICTACTOE, {0: _Garbage(), 1: RandomAgent(0)}, seed=0)
    assert not record.failed
    assert record.rewards[0] == -1 and record.rewards[1] == 1
    garbage_steps = [s for s in record.steps if s.player_id == 0]
    assert len(garbage_steps) == 2 and all(s.invalid_move for s in garbage_steps)


class _Crash(Agent):
    name = "crash"

    def act(self, observation):
        raise RuntimeError("model server went away")


def test_crashing_agent_or_env_yields_failed_record(caplog, monkeypatch):
    with caplog.at_level(logging.ERROR):
        record = play_episode(TICTACTOE, {0: RandomAgent(0), 1: _Crash()}, seed=0)
    assert record.failed and "model server went away" in record.error
    assert "failed" in caplog.text

    import textarena

    original_make = textarena.make

    def make_broken(env_id):
        env = original_make(env_id)
        env.step = lambda action: (_ for _ in ()).throw(TypeError("'NoneType' object is not subscriptable"))
        return env

    monkeypatch.setattr(textarena, "make", make_broken)
    record = play_episode(TICTACTOE, {0: RandomAgent(0), 1: RandomAgent(1)}, seed=0)
    assert record.failed and "NoneType" in record.error and record.rewards == {}


def test_turn_cap_truncates_as_draw():
    record = play_episode(TICTACTOE, {0: RandomAgent(0), 1: RandomAgent(1)}, seed=0, max_turns=3)
    assert record.truncated and not record.failed
    assert record.rewards == {0: 0.0, 1: 0.0} and len(record.steps) == 3


@pytest.mark.slow
def test_single_hand_kuhn_poker_between_equilibrium_players_is_worth_minus_one_eighteenth():
    spec = EnvSpec("KuhnPoker-v0-single-train", 2, "qwen3-zs")
    games = 4000  # payoff std ~1.3 chips: standard error ~0.02
    first_player = []
    for seed in range(games):  # agent seeds apart from the env seed, whose global RNG deals the cards
        agents = {pid: make_scripted_agent("kuhn-nash", 10**6 + 2 * seed + pid) for pid in (0, 1)}
        first_player.append(play_episode(spec, agents, seed=seed).rewards[1])  # TextArena's Player 1 opens
    assert abs(sum(first_player) / games - (-1 / 18)) < 0.07


class _DiceEnv:
    """Draws from Python's and numpy's global generators, as TextArena envs do (`reset` re-seeds `random`)."""

    def reset(self, num_players, seed=None):
        random.seed(seed)

    def step(self, action):
        return False, (random.random(), shuffle([1, 2, 3, 4, 5]), np.random.rand())


def shuffle(items):
    """`from random import shuffle`, the import style some envs use."""
    random_shuffle(items)
    return items


def _rolls(env, n):
    return [env.step("roll")[1] for _ in range(n)]


def test_a_game_draws_from_its_own_random_states_whatever_else_draws():
    alone = OwnRandomEnv(_DiceEnv(), seed=1)
    alone.reset(num_players=1, seed=1)
    expected = _rolls(alone, 4)
    outside = random.getstate(), np.random.get_state()[1].copy()
    first, second = OwnRandomEnv(_DiceEnv(), seed=1), OwnRandomEnv(_DiceEnv(), seed=2)
    first.reset(num_players=1, seed=1)
    second.reset(num_players=1, seed=2)
    interleaved = [(_rolls(first, 1)[0], _rolls(second, 1)[0], random.random()) for _ in range(4)]
    assert [a for a, _, _ in interleaved] == expected  # neither the other game nor the caller shifted its draws
    random.setstate(outside[0])
    assert [c for _, _, c in interleaved] == [random.random() for _ in range(4)]  # ... untouched by the games
    assert (np.random.get_state()[1] == outside[1]).all()
    twin = copy.deepcopy(first)
    assert _rolls(twin, 3) == _rolls(first, 3)  # a copy goes on from the same states


class _ServiceEnv:
    """An env whose every step waits 50 ms for a remote service (a jury of models) and draws a card."""

    calls_in_progress = 0
    most_at_once = 0
    lock = threading.Lock()

    def reset(self, num_players, seed=None):
        random.seed(seed)

    def step(self, action):
        with _ServiceEnv.lock:
            _ServiceEnv.calls_in_progress += 1
            _ServiceEnv.most_at_once = max(_ServiceEnv.most_at_once, _ServiceEnv.calls_in_progress)
        time.sleep(0.05)
        card = random.randint(1, 1000)
        with _ServiceEnv.lock:
            _ServiceEnv.calls_in_progress -= 1
        return False, card


def test_games_waiting_on_a_service_in_their_env_calls_wait_side_by_side_with_their_own_chance():
    """Env calls of different games run at once (they ran one at a time under a process-wide lock, so an env that
    calls a network service serialised every game), and each game still draws its own cards."""
    expected = OwnRandomEnv(_ServiceEnv(), seed=7)
    expected.reset(num_players=2, seed=7)
    cards = [expected.step("x")[1] for _ in range(3)]
    _ServiceEnv.most_at_once = 0
    games = [OwnRandomEnv(_ServiceEnv(), seed=7) for _ in range(8)]
    drawn = [[] for _ in games]

    def play(index):
        games[index].reset(num_players=2, seed=7)
        drawn[index] += [games[index].step("x")[1] for _ in range(3)]

    threads = [threading.Thread(target=play, args=(i,)) for i in range(len(games))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _ServiceEnv.most_at_once > 1  # 1 before
    assert drawn == [cards] * len(games)


def test_no_textarena_module_holds_a_global_generator_function_imported_by_name():
    """Routing reaches draws through `random.*` and `np.random.*`; `random` or numpy functions imported by name
    before it (`from numpy.random import rand`) would draw outside the game's generators."""
    import importlib
    import pkgutil
    import sys

    import textarena

    for module in pkgutil.walk_packages(textarena.__path__, "textarena.", onerror=lambda name: None):
        try:
            importlib.import_module(module.name)
        except Exception:  # noqa: BLE001, S112 - an optional dependency some env lacks: not one we play
            continue
    generators = (random._inst, np.random.mtrand._rand)
    captured = [
        f"{name}.{attribute}"
        for name, module in list(sys.modules.items())
        if name.startswith("textarena")
        for attribute, value in vars(module).items()
        if any(getattr(value, "__self__", None) is generator for generator in generators)
    ]
    assert captured == []
