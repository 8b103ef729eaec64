"""One hand of Kuhn Poker, rewarded in chips: the game whose equilibrium the evaluation measures against.

TextArena's `KuhnPoker-v0` plays three hands, rewards +1/-1 for holding more chips at the end, and never
moves a bet or a call into the pot (every hand is worth the antes). Under those rules folding is never
better than calling, so their equilibrium is not Kuhn Poker's. `KuhnPokerHandEnv` plays a single hand, puts
bets and calls in the pot and rewards each player the chips it won or lost (+-1 or +-2): the zero-sum payoff
of game-theoretic Kuhn Poker, whose equilibrium value for the first player is -1/18.
"""

from __future__ import annotations

import re

from textarena.envs.KuhnPoker.env import KuhnPokerEnv

_MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)  # TextArena's own action pattern


class KuhnPokerHandEnv(KuhnPokerEnv):
    """TextArena's Kuhn Poker limited to one hand, with bets in the pot and chips won as the rewards."""

    def __init__(self):
        super().__init__(max_rounds=1)

    def step(self, action: str):
        """TextArena's step, after a legal bet or call has moved one chip from the player into the pot."""
        match = _MOVE.search(action.strip())
        move = match.group(1).lower() if match else None
        game = self.state.game_state
        if move in ("bet", "call") and move in game["current_legal_action_tree"]:
            game["pot"] += 1
            game["player_chips"][self.state.current_player_id] -= 1
        return super().step(action)

    def _init_round(self):
        game_over = self.state.game_state["current_round"] >= self.max_rounds
        chips = dict(self.state.game_state["player_chips"])  # before TextArena antes for a hand never played
        super()._init_round()
        if game_over:
            self.state.rewards = chips
