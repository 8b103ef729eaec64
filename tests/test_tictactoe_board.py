"""`unstable.games.tictactoe`, the one copy of TicTacToe's board logic, on hand-made boards and on real TextArena
observations."""

from __future__ import annotations

import pytest
import textarena as ta

from unstable.games import tictactoe

# O | O | .      O holds cells 0, 1; X holds 3, 4; cell 2 wins for O, cell 5 for X
# X | X | .
# . | . | .
TWO_THREATS = "OO XX    "


@pytest.mark.parametrize("env_id", ["TicTacToe-v0-train", "TicTacToe-v0"])
def test_read_board_reads_the_current_board_of_either_env(env_id):
    env = ta.make(env_id)
    env.reset(num_players=2, seed=0)
    for move in ["[4]", "[0]", "[8]"]:
        env.step(move)
    assert tictactoe.read_board(env.get_observation()[1]) == "X   O   O"


def test_read_board_refuses_other_text():
    with pytest.raises(ValueError, match="no 'Current Board:'"):
        tictactoe.read_board("Your card is: 'K'")
    with pytest.raises(ValueError, match="three board rows"):
        tictactoe.read_board("Current Board:\n O | X | 2 \n")


def test_who_moves_and_who_won():
    assert tictactoe.to_move(tictactoe.EMPTY_BOARD) == "O" and tictactoe.to_move("O        ") == "X"
    assert tictactoe.opponent("O") == "X" and tictactoe.opponent("X") == "O"
    assert tictactoe.empty_cells(TWO_THREATS) == [2, 5, 6, 7, 8]
    assert tictactoe.place(TWO_THREATS, 2, "O") == "OOOXX    "
    assert tictactoe.winner(TWO_THREATS) is None and tictactoe.winner("OOOXX    ") == "O"
    assert tictactoe.winner("X O XO  X") == "X"  # the diagonal 0-4-8
    assert tictactoe.winner("OXOOXXXOO") is None  # a full board, drawn


def test_winning_and_blocking_cells():
    assert tictactoe.winning_cells(TWO_THREATS, "O") == [2] and tictactoe.winning_cells(TWO_THREATS, "X") == [5]
    assert tictactoe.blocking_cells(TWO_THREATS, "O") == [5]
    assert tictactoe.completing_lines(TWO_THREATS, "O", 2) == [(0, 1, 2)]
    fork = "O   O X X"  # O: 0 and 4; cell 8 is X's, so the diagonal is closed
    assert tictactoe.winning_cells(fork, "O") == [] and tictactoe.winning_cells("O   O    ", "O") == [8]
    double = "OO O     "  # cell 2 completes the top row, cell 6 the left column
    assert tictactoe.winning_cells(double, "O") == [2, 6]
    assert [tictactoe.line_kind(line) for line in tictactoe.LINES] == ["row"] * 3 + ["column"] * 3 + ["diagonal"] * 2
