"""`unstable play`: a person plays a checkpoint or a pool opponent in a terminal (tmux here: the moves typed with
send-keys, the pane read back), the game is saved in the collector's record format, and bad input is one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from unstable.cli.main import main
from unstable.records import GAMES_FILE

PROMPT = "your move>"


class Terminal:
    """`unstable play ARGS` running in a tmux session of its own (160 x 50) on a private tmux server."""

    def __init__(self, *args: str):
        self.socket, self.session = f"ub-play-{uuid.uuid4().hex[:8]}", "play"
        command = f"env -u COLUMNS -u LINES {sys.executable} -m unstable.cli.main play {' '.join(args)}; sleep 600"
        start = ["new-session", "-d", "-s", self.session, "-x", "160", "-y", "50", "-c", str(Path.cwd()), command]
        self.tmux(*start)

    def tmux(self, *args: str) -> str:
        """Run a tmux command against this session's server; its output."""
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        """Everything the program printed so far (the pane and its scrollback)."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.session)  # -J: wrapped lines whole

    def type(self, *keys: str) -> None:
        """Type `keys` as a person would: text literally, then Enter."""
        for text in keys:
            self.tmux("send-keys", "-t", self.session, "-l", text)
            self.tmux("send-keys", "-t", self.session, "Enter")

    def play(self, first_moves: list[str], timeout: float = 300) -> str:
        """Answer each prompt with the next of `first_moves`, then with the first available move, until the game
        ends ("game saved" or "not saved" on the screen); the final screen."""
        prompts, deadline = 0, time.time() + timeout  # a hang guard, not a speed check
        while time.time() < deadline:
            screen = self.screen()
            if "game saved:" in screen or "not saved" in screen:
                return screen
            lines = [line for line in screen.splitlines() if line.strip()]
            if lines and lines[-1].strip() == PROMPT and screen.count(PROMPT) > prompts:
                prompts = screen.count(PROMPT)
                available = re.findall(r"'(\[\d+\])'", [line for line in lines if "Available Moves" in line][-1])
                self.type(first_moves.pop(0) if first_moves else available[0])
            time.sleep(0.3)
        raise AssertionError(f"the game did not end in {timeout} s:\n{self.screen()}")

    def wait_for(self, text: str, timeout: float = 300) -> str:
        """The screen once `text` is on it (a hang guard of `timeout` seconds, not a speed check)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.3)
        raise AssertionError(f"{text!r} did not appear in {timeout} s:\n{self.screen()}")

    def close(self) -> None:
        """End the tmux server and the program in it."""
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def _saved_games(out: Path) -> list[dict]:
    return [game for line in (out / GAMES_FILE).read_text().splitlines() for game in json.loads(line)]


def _check_finished_game(screen: str, out: Path, opponent: str, seat: int) -> dict:
    assert "Traceback" not in screen, screen
    assert re.search(r"unstable: you (won|drew|lost)", screen), screen
    (game,) = _saved_games(out)
    assert game["error"] is None and game["rewards"]
    assert game["players"][str(seat)] == "human" and game["players"][str(1 - seat)] == opponent
    assert game["learner_player_ids"] == [1 - seat]  # the opponent's seat, as the model's in an evaluation game
    assert any(step["player_id"] == seat for step in game["steps"])
    return game


@pytest.fixture
def terminal():
    """Start a Terminal with `terminal(*args)`; every one started is closed after the test."""
    started = []

    def start(*args: str) -> Terminal:
        started.append(Terminal(*args))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.mark.slow  # runs the command under tmux
def test_a_person_plays_the_random_agent_by_name_and_the_game_is_saved(terminal, tmp_path):
    out = tmp_path / "games"
    screen = terminal("random", "--env", "TicTacToe-v0", "--seat", "1", "--out", str(out)).play(["hello"])
    assert "Player 1 attempted an invalid move" in screen  # the env's own report of the typed "hello"
    game = _check_finished_game(screen, out, "random", seat=1)
    assert game["steps"][1]["action"] == "hello" and game["steps"][1]["invalid_move"]
    assert f"game saved: {out / GAMES_FILE}" in screen


@pytest.mark.slow
def test_a_person_plays_an_adapter_checkpoint_of_the_tiny_model(terminal, tiny_model_dir, tmp_path):
    """The adapter `unstable sft` saves (as the learner saves its checkpoints), on the base model it records."""
    sft = ["sft", "--model", tiny_model_dir, "--games", "2", "--epochs", "1", "--lora-rank", "4", "--threads", "1"]
    assert main([*sft, "--out-dir", str(tmp_path / "sft")]) == 0
    (adapter,) = (tmp_path / "sft" / "checkpoints").iterdir()
    out = tmp_path / "games"
    screen = terminal(str(adapter), "--threads", "1", "--out", str(out)).play([])
    assert f"unstable: loading {adapter} (on {tiny_model_dir})" in screen
    game = _check_finished_game(screen, out, "opponent-" + re.sub(r"[^\w-]", "_", str(adapter)), seat=0)
    model_moves = [step for step in game["steps"] if step["player_id"] == 1]
    assert all(step["completion_token_ids"] and step["prompt"] for step in model_moves)  # the model's own tokens


@pytest.mark.slow
def test_a_person_plays_a_whole_model_checkpoint(terminal, tiny_model_dir, tmp_path):
    """A directory with a model's config.json, as the learner saves full fine-tuning checkpoints."""
    out = tmp_path / "games"
    screen = terminal(tiny_model_dir, "--threads", "1", "--out", str(out)).play([])
    assert f"unstable: loading {tiny_model_dir}\n" in screen
    _check_finished_game(screen, out, "model", seat=0)


@pytest.mark.slow  # runs the command under tmux
def test_quit_or_ctrl_d_ends_the_game_with_a_line_and_saves_nothing(terminal, tmp_path):
    out = tmp_path / "games"
    screen = terminal("tictactoe-minimax", "--out", str(out)).play(["[4]", "quit"])
    assert "unstable: you left the game; it is not saved" in screen and "Traceback" not in screen
    ctrl_d = terminal("random", "--out", str(out))
    ctrl_d.wait_for(PROMPT)
    ctrl_d.tmux("send-keys", "-t", ctrl_d.session, "C-d")
    screen = ctrl_d.wait_for("not saved")
    assert "unstable: you left the game; it is not saved" in screen and "Traceback" not in screen
    assert not out.exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (["random", "--env", "TicTacToe-v9"], "--env TicTacToe-v9: unknown TextArena env id"),
        (["TMP/no-such-checkpoint"], "CHECKPOINT TMP/no-such-checkpoint: directory"),
        (["grandmaster"], "CHECKPOINT grandmaster: opponent 'grandmaster' must be"),
        (["TMP"], "CHECKPOINT TMP: neither a LoRA adapter"),
        (["random", "--seat", "2"], "--seat 2: a seat of the 2 players"),
        (["random", "--temperature", "-1"], "--temperature -1.0: Input should be greater than or equal to 0"),
    ],
)
def test_bad_input_is_one_error_line_with_status_2_and_creates_nothing(tmp_path, capsys, args, named):
    out = tmp_path / "games"
    argv = ["play", *(arg.replace("TMP", str(tmp_path)) for arg in args), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + named.replace("TMP", str(tmp_path))) and err.count("\n") == 1, err
    assert not out.exists()
