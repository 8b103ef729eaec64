"""API opponents against a real chat-completions server on 127.0.0.1: whole games, retries, timeouts, failures
that become failed game records, and a key that never leaks; opponent names that resolve to API models."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterator

import pytest

from unstable.agents.api import APIAgent, APIOpponentError, APISettings
from unstable.agents.scripted import RandomAgent
from unstable.agents.seating import make_agent, parse_opponent
from unstable.games.episode import play_episode
from unstable.games.moves import legal_moves
from unstable.records import EnvSpec

from .chat_server import ChatServer, completion, serve

MODEL = "test-org/test-model:free"
KEY_ENV = "UNSTABLE_TEST_API_KEY"
KEY = "sk-test-do-not-leak-8c1f0e"
SPEC = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
SLOW_REPLY_S = 1.0

Reply = tuple[int, dict]


@pytest.fixture
def server() -> Iterator[ChatServer]:
    """A chat-completions server on 127.0.0.1 for the test's duration."""
    with serve() as chat:
        yield chat


def legal_move_reply(number: int, headers: dict, body: dict) -> Reply:
    """The first legal move of the user message, boxed; 401 unless the request carries the key."""
    if headers.get("Authorization") != f"Bearer {KEY}":
        return 401, {"error": {"message": "missing or wrong key"}}
    return 200, completion(f"I take the first free cell: \\boxed{{{legal_moves(body['messages'][-1]['content'])[0]}}}")


def always_500(number: int, headers: dict, body: dict) -> Reply:
    """A server that is down."""
    return 500, {"error": {"message": "internal error"}}


def too_slow(number: int, headers: dict, body: dict) -> Reply:
    """Answers only after SLOW_REPLY_S, well past the client's timeout."""
    time.sleep(SLOW_REPLY_S)
    return legal_move_reply(number, headers, body)


def fails_twice(number: int, headers: dict, body: dict) -> Reply:
    """500 for the first two requests, then legal moves."""
    return always_500(number, headers, body) if number <= 2 else legal_move_reply(number, headers, body)


@pytest.fixture
def settings(server: ChatServer, monkeypatch) -> APISettings:
    """Settings for the local server with the key set in KEY_ENV and tiny waits."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return APISettings(base_url=server.url, api_key_env=KEY_ENV, timeout_s=2.0, max_retries=3, backoff_s=0.001)


def play_api_game(settings: APISettings, seed: int = 0):
    """One TicTacToe game: the API model in seat 0 against a random agent."""
    return play_episode(SPEC, {0: APIAgent(MODEL, settings), 1: RandomAgent(seed)}, seed)


def test_api_opponent_plays_a_whole_game_with_legal_moves_and_the_key(server, settings):
    server.behaviour = legal_move_reply
    record = play_api_game(settings)
    assert not record.failed and record.rewards and record.players[0] == MODEL
    api_steps = [step for step in record.steps if step.player_id == 0]
    assert api_steps and len(server.requests) == len(api_steps)
    assert all(s.format_ok and not s.invalid_move and s.action in legal_moves(s.observation) for s in api_steps)
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == MODEL and request["body"]["max_tokens"] == settings.max_tokens
    assert [m["role"] for m in request["body"]["messages"]] == ["system", "user"]
    assert request["body"]["messages"][1]["content"] == api_steps[0].observation


def test_a_server_that_stays_down_fails_the_game_after_every_retry(server, settings):
    server.behaviour = always_500
    record = play_api_game(settings)
    assert record.failed and not record.steps
    assert "APIOpponentError" in record.error and MODEL in record.error and "HTTP 500" in record.error
    assert len(server.requests) == settings.max_retries + 1


def test_a_request_past_the_timeout_fails_the_game_without_hanging(server, settings):
    server.behaviour = too_slow
    quick = settings.model_copy(update={"timeout_s": 0.2, "max_retries": 1})
    record = play_api_game(quick)  # answered in time, the game would not fail: the client gave up, no clock needed
    assert record.failed and MODEL in record.error and "timed out" in record.error
    assert len(server.requests) == quick.max_retries + 1


def test_two_server_errors_then_success_finish_the_game(server, settings):
    server.behaviour = fails_twice
    record = play_api_game(settings)
    assert not record.failed and record.rewards
    assert len(server.requests) == 2 + sum(step.player_id == 0 for step in record.steps)


def test_a_client_error_fails_at_once_and_no_key_sends_no_authorization(server, settings, monkeypatch):
    server.behaviour = legal_move_reply
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(APIOpponentError, match="HTTP 401"):
        APIAgent(MODEL, settings).act("Available Moves: '[0]', '[1]'")
    assert len(server.requests) == 1 and "Authorization" not in server.requests[0]["headers"]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_never_carries_the_key(server, settings, status):
    with serve(lambda number, headers, body: (200, completion("\\boxed{[0]}"))) as elsewhere:  # another port
        target = elsewhere.url + "/chat/completions"
        server.behaviour = lambda number, headers, body: (status, {}, {"Location": target})
        try:
            APIAgent(MODEL, settings).act("Available Moves: '[0]', '[1]'")
            error = ""
        except APIOpponentError as refused:
            error = str(refused)
        assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
        assert [request["headers"].get("Authorization") for request in elsewhere.requests] in ([], [None])
        assert f"HTTP {status} redirect to {target}" in error and KEY not in error


def test_the_key_appears_in_no_log_error_or_repr(server, settings, caplog):
    caplog.set_level(logging.DEBUG)
    agent = APIAgent(MODEL, settings)
    server.behaviour = fails_twice
    assert not play_episode(SPEC, {0: agent, 1: RandomAgent(0)}, seed=0).failed
    server.behaviour = always_500
    with pytest.raises(APIOpponentError) as error:
        agent.act("Available Moves: '[0]'")
    failed = play_episode(SPEC, {0: agent, 1: RandomAgent(0)}, seed=0)
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    warnings = [r.getMessage() for r in caplog.records if r.name == "unstable.agents.api"]
    assert warnings and all(MODEL in line and "HTTP 500" in line for line in warnings)
    texts = [r.getMessage() for r in caplog.records] + [failed.error, repr(agent), repr(settings), str(settings)]
    texts.append("".join(traceback.format_exception(error.value)))
    assert all(KEY not in text for text in texts)


def test_parse_opponent_resolves_org_model_names_to_api_opponents(monkeypatch):
    opponent = parse_opponent("google/gemini-2.0-flash-lite-001")
    assert opponent.api_model == opponent.agent_id == "google/gemini-2.0-flash-lite-001"
    assert opponent.checkpoint is None and opponent.fixed is None
    monkeypatch.setenv("UNSTABLE_API_BASE_URL", "http://127.0.0.1:9/v1")
    agent = make_agent(opponent, None, None, None, seed=0)
    assert isinstance(agent, APIAgent) and agent.name == opponent.api_model
    assert agent.settings.base_url == "http://127.0.0.1:9/v1"
    monkeypatch.delenv("UNSTABLE_API_BASE_URL")
    assert APISettings.from_env().base_url == "https://openrouter.ai/api/v1"


@pytest.mark.parametrize("name", ["runs/missing/ckpt-3", "./ckpt", "/abs/ckpt"])
def test_parse_opponent_rejects_missing_directories_by_name(name):
    with pytest.raises(ValueError, match=f"directory '{name}' does not exist.*'org/model'"):
        parse_opponent(name)


@pytest.mark.parametrize("name", ["gpt-4o", "a/b/c", "org/", "org/model name"])
def test_parse_opponent_lists_the_accepted_forms_for_unknown_names(name):
    with pytest.raises(ValueError, match="LoRA checkpoint directory.*scripted agent.*random.*API model 'org/model'"):
        parse_opponent(name)
