"""Scripted reference opponents that read TextArena observations like a model and answer with a move string.

Every agent is deterministic given its seed: it draws all randomness (tie-breaks, mixed strategies) from its
own `random.Random(seed)`, never from the global `random` module, which TextArena re-seeds on every reset.
Parsers read the *current* state (the last board / the current round) so they work on the observations of both
`-train` envs (prompt, game messages, current board) and default envs (the whole history).
"""

from __future__ import annotations

import functools
import inspect
import operator
import random
import re
from fractions import Fraction

from unstable.games import tictactoe
from unstable.games.agent import Agent
from unstable.games.kuhn import INFOSETS, nash_strategy
from unstable.games.moves import legal_moves, nim_piles
from unstable.records import Decision

_KUHN_CARD = re.compile(r"Your card is: '([JQK])'")
_KUHN_MOVE = re.compile(r"Player \d, submitted move: '\[(check|bet|call|fold)\]'")


class RandomAgent(Agent):
    """Uniformly random legal move. If no legal move can be parsed it submits FALLBACK_ACTION with
    format_ok=False, leaving the env to judge it (usually an invalid move) rather than crashing the game."""

    name = "random"
    FALLBACK_ACTION = "[0]"

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def act(self, observation: str) -> Decision:
        """Pick one of the parsed legal moves at random."""
        legal = legal_moves(observation)
        if not legal:
            return Decision(action=self.FALLBACK_ACTION, format_ok=False)
        return Decision(action=self._rng.choice(legal))


def _board_to_play(observation: str) -> str:
    """The current TicTacToe board; raises when there is no move to make."""
    board = tictactoe.read_board(observation)
    if not tictactoe.empty_cells(board):
        raise ValueError("the board is full; there is no move to make")
    return board


@functools.cache
def _move_score(board: str, cell: int) -> int:
    """Minimax score, for the player to move, of playing `cell`: a win scores 1 + the empty cells left (so
    faster wins score higher and slower losses lower in magnitude), a draw 0, otherwise minus the opponent's
    best reply."""
    mover = tictactoe.to_move(board)
    child = tictactoe.place(board, cell, mover)
    if tictactoe.winner(child) == mover:
        return 1 + child.count(tictactoe.EMPTY)
    replies = [_move_score(child, reply) for reply in tictactoe.empty_cells(child)]
    return -max(replies) if replies else 0


class TicTacToeMinimaxAgent(Agent):
    """Perfect TicTacToe play by full minimax on the parsed board; ties between equally good moves are broken
    by the seeded RNG. With `epsilon` > 0 each move is instead a uniformly random empty cell with probability
    `epsilon` ('tictactoe-minimax:epsilon=0.5'): a reference opponent, or a teacher, of any strength between
    random (1) and perfect (0)."""

    def __init__(self, seed: int, epsilon: float = 0):
        if not 0 <= epsilon <= 1:
            raise ValueError(f"tictactoe-minimax: epsilon must be in [0, 1], got {epsilon}")
        self._rng = random.Random(seed)
        self.epsilon = epsilon
        self.name = f"tictactoe-minimax:epsilon={epsilon}" if epsilon else "tictactoe-minimax"

    def act(self, observation: str) -> Decision:
        """Play one of the best cells for whoever is to move on the current board (a random one with probability
        epsilon)."""
        board = _board_to_play(observation)
        cells = tictactoe.empty_cells(board)
        if self.epsilon and self._rng.random() < self.epsilon:  # epsilon 0 draws nothing: tie-breaks as before
            return Decision(action=f"[{self._rng.choice(cells)}]")
        scores = {cell: _move_score(board, cell) for cell in cells}
        best = max(scores.values())
        return Decision(action=f"[{self._rng.choice([c for c in cells if scores[c] == best])}]")


def _center(board: str, mark: str) -> list[int]:
    """The center, when it is empty."""
    return [tictactoe.CENTER] if board[tictactoe.CENTER] == tictactoe.EMPTY else []


class TicTacToeRulesAgent(Agent):
    """TicTacToe by a fixed list of rules, each naming the cells it would play: the first rule that names a cell
    decides (its lowest cell), else a uniformly random empty cell. With no rules (this class) it is the random agent
    on the board; each subclass below is one skill of TicTacToe, its win rate against the random agent measured by
    `python benchmarks/tictactoe_heuristics.py` (20,000 games in each seat, seed 0)."""

    name = "tictactoe-rules"
    RULES: tuple = ()  # functions (board, mark of the player to move) -> the cells the rule would play

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def choose_cell(self, board: str) -> int:
        """The cell to play on `board` (one with an empty cell) for whoever is to move."""
        mark = tictactoe.to_move(board)
        for rule in self.RULES:
            cells = rule(board, mark)
            if cells:
                return cells[0]
        return self._rng.choice(tictactoe.empty_cells(board))

    def act(self, observation: str) -> Decision:
        """The rules' cell on the current board."""
        return Decision(action=f"[{self.choose_cell(_board_to_play(observation))}]")


class TicTacToeCenterAgent(TicTacToeRulesAgent):
    """The center when it is free, else a uniformly random empty cell: an opening preference and no tactics
    (0.539 against the random agent); a teacher for warm starts that open in the center (`--sft-agent`; measured in
    experiments/log.md, "Across seeds: can the tiny model be taught to complete a line?")."""

    name = "tictactoe-center"
    RULES = (_center,)


class TicTacToeWinAgent(TicTacToeRulesAgent):
    """Completes a line when it can, else a uniformly random empty cell: the one skill of winning at once
    (0.667 against the random agent)."""

    name = "tictactoe-win"
    RULES = (tictactoe.winning_cells,)


class TicTacToeWinCenterAgent(TicTacToeRulesAgent):
    """Completes a line when it can, else the center, else a random empty cell (0.790 against the random agent)."""

    name = "tictactoe-win-center"
    RULES = (tictactoe.winning_cells, _center)


class TicTacToeWinBlockAgent(TicTacToeRulesAgent):
    """Completes a line when it can, else stops the opponent's, else a uniformly random empty cell: the two
    one-move tactics and no opening (0.796 against the random agent). As a training opponent it punishes both
    tactics missed: a line left open is blocked, a threat left open is completed."""

    name = "tictactoe-win-block"
    RULES = (tictactoe.winning_cells, tictactoe.blocking_cells)


class TicTacToeWinBlockCenterAgent(TicTacToeRulesAgent):
    """Completes a line when it can, else stops the opponent's, else the center, else a random empty cell: every
    one-move tactic, no lookahead (0.890 against the random agent)."""

    name = "tictactoe-win-block-center"
    RULES = (tictactoe.winning_cells, tictactoe.blocking_cells, _center)


def kuhn_infoset(observation: str) -> str:
    """The acting player's information set in the current round, as an `unstable.games.kuhn` key: the
    card from the last "Your card is" line plus c/b for each check/bet submitted since the last round start."""
    cards = _KUHN_CARD.findall(observation)
    if not cards:
        raise ValueError("no \"Your card is: '...'\" in the observation; is this Kuhn Poker?")
    this_round = observation.rsplit("Starting round", 1)[-1]
    key = cards[-1] + "".join(move[0] for move in _KUHN_MOVE.findall(this_round))
    if key not in INFOSETS:
        raise ValueError(f"not a decision point of a Kuhn Poker round: {key!r}")
    return key


class KuhnPokerStrategyAgent(Agent):
    """Plays a fixed Kuhn Poker strategy (`strategy`: P(bet or call) per information set) in every round, as the
    first or second player according to who opened the current round."""

    strategy: dict[str, float]

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def act(self, observation: str) -> Decision:
        """Bet/call with the strategy's probability at the current information set, else check/fold."""
        key = kuhn_infoset(observation)
        facing_bet = key.endswith("b")
        aggressive = self._rng.random() < self.strategy[key]
        if facing_bet:
            return Decision(action="[call]" if aggressive else "[fold]")
        return Decision(action="[bet]" if aggressive else "[check]")


class KuhnPokerNashAgent(KuhnPokerStrategyAgent):
    """The Kuhn Poker equilibrium `nash_strategy(alpha)`."""

    def __init__(self, seed: int, alpha: float = Fraction(1, 6)):
        super().__init__(seed)
        self.strategy = nash_strategy(alpha)
        self.name = f"kuhn-nash:alpha={alpha}"


class KuhnPokerHonestAgent(KuhnPokerStrategyAgent):
    """Bets and calls with the King only; checks and folds the Jack and the Queen. It never bluffs, so against it a
    Queen facing a bet should fold and a Queen first to act should check, while the King's choices are even:
    an opponent that makes the Queen's moves unequal where self-play leaves them nearly even (exploitability 1/4)."""

    name = "kuhn-honest"

    def __init__(self, seed: int):
        super().__init__(seed)
        self.strategy = {key: float(key[0] == "K") for key in INFOSETS}


class NimOptimalAgent(Agent):
    """Nim by nim-sum: move to a position with nim-sum 0 when possible (ties by the seeded RNG), otherwise a
    random legal move. Moves are '[pile quantity]', e.g. '[2 3]' takes 3 from pile 2."""

    name = "nim-optimal"

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def act(self, observation: str) -> Decision:
        """Take the winning amount from a pile, or anything when the position is lost."""
        piles = nim_piles(observation)
        if not any(piles):
            raise ValueError("no non-empty 'Current Pile:' block in the observation; is this Nim?")
        nim_sum = functools.reduce(operator.xor, piles)
        winning = [f"[{pile} {size - (size ^ nim_sum)}]" for pile, size in enumerate(piles) if size ^ nim_sum < size]
        return Decision(action=self._rng.choice(winning or legal_moves(observation)))


SCRIPTED_AGENTS: dict[str, type[Agent]] = {
    "random": RandomAgent,
    "tictactoe-minimax": TicTacToeMinimaxAgent,
    "tictactoe-center": TicTacToeCenterAgent,
    "tictactoe-win": TicTacToeWinAgent,
    "tictactoe-win-center": TicTacToeWinCenterAgent,
    "tictactoe-win-block": TicTacToeWinBlockAgent,
    "tictactoe-win-block-center": TicTacToeWinBlockCenterAgent,
    "kuhn-nash": KuhnPokerNashAgent,
    "kuhn-honest": KuhnPokerHonestAgent,
    "nim-optimal": NimOptimalAgent,
}


def make_scripted_agent(name: str, seed: int) -> Agent:
    """Build a scripted agent by name: a key of SCRIPTED_AGENTS, optionally followed by ':' and comma-separated
    numeric constructor parameters, e.g. 'kuhn-nash:alpha=0.2' or 'kuhn-nash:alpha=1/6' (parsed as Fractions)."""
    base, _, params = name.partition(":")
    if base not in SCRIPTED_AGENTS:
        raise ValueError(f"unknown scripted agent {name!r}; valid names: {', '.join(SCRIPTED_AGENTS)}")
    cls = SCRIPTED_AGENTS[base]
    accepted = set(inspect.signature(cls).parameters) - {"seed"}
    kwargs = {}
    for item in filter(None, params.split(",")):
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in accepted or not value:
            raise ValueError(f"bad parameter {item!r} for {base!r}; it accepts {sorted(accepted) or 'none'}")
        kwargs[key] = Fraction(value)
    return cls(seed=seed, **kwargs)
