"""Exact game theory for one round of Kuhn Poker, and the TextArena observations that reach each decision.

The game: ante 1, bet 1, cards J < Q < K, one card each. The *first player* acts first (check or bet); after a
check the *second player* may check (showdown for 1) or bet; a bet is answered by call (showdown for 2) or fold.
In these formulas player 0 is always the first player and player 1 the second. TextArena's KuhnPoker-v0 plays
several such rounds and alternates who opens: round 1 is opened by its Player 1, round 2 by its Player 0, ...

A strategy is a mapping from information-set key to the probability of the *aggressive* action there (bet when
no bet is on the table, call when facing one). A key is the card followed by the round's betting so far, one
letter per action (c = check, b = bet), which is exactly what the acting player knows:
first player: "J", "Q", "K" (opening) and "Jcb", "Qcb", "Kcb" (after check-bet);
second player: "Jc", "Qc", "Kc" (after a check) and "Jb", "Qb", "Kb" (after a bet).
Values are chips won per round by the player named; fractions.Fraction inputs give exact answers.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction

from unstable.games.moves import legal_moves

CARDS = "JQK"
FIRST_PLAYER_INFOSETS = ("J", "Q", "K", "Jcb", "Qcb", "Kcb")
SECOND_PLAYER_INFOSETS = ("Jc", "Qc", "Kc", "Jb", "Qb", "Kb")
INFOSETS = FIRST_PLAYER_INFOSETS + SECOND_PLAYER_INFOSETS
AGGRESSIVE_ACTIONS = ("[bet]", "[call]")
EQUILIBRIUM_VALUE = Fraction(-1, 18)

Strategy = Mapping[str, float]


def nash_strategy(alpha: float = Fraction(1, 6)) -> dict[str, float]:
    """The equilibrium with parameter alpha in [0, 1/3] (Kuhn 1950); every member gives the first player -1/18.

    First player: bets J with prob alpha, K with 3*alpha, never Q; after check-bet calls Q with alpha + 1/3,
    always K, never J. Second player: after a check bets K, J with 1/3, never Q; facing a bet calls K,
    Q with 1/3, never J.
    """
    if not 0 <= alpha <= Fraction(1, 3):
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    third = Fraction(1, 3)
    first = {"J": alpha, "Q": 0, "K": 3 * alpha, "Jcb": 0, "Qcb": alpha + third, "Kcb": 1}
    second = {"Jc": third, "Qc": 0, "Kc": 1, "Jb": 0, "Qb": third, "Kb": 1}
    return first | second


def deal_value(first_card: str, second_card: str, first: Strategy, second: Strategy) -> float:
    """Expected chips won by the first player for one deal."""
    showdown = 1 if CARDS.index(first_card) > CARDS.index(second_card) else -1
    bet = first[first_card]
    call_bet = second[second_card + "b"]
    bet_after_check = second[second_card + "c"]
    call_after_check_bet = first[first_card + "cb"]
    after_bet = call_bet * 2 * showdown + (1 - call_bet) * 1
    after_check_bet = call_after_check_bet * 2 * showdown + (1 - call_after_check_bet) * -1
    after_check = (1 - bet_after_check) * showdown + bet_after_check * after_check_bet
    return bet * after_bet + (1 - bet) * after_check


def game_value(strategy_p0: Strategy, strategy_p1: Strategy) -> float:
    """Expected chips per round won by the first player, playing strategy_p0's first-player part against
    strategy_p1's second-player part, averaged over the 6 equally likely deals."""
    deals = list(itertools.permutations(CARDS, 2))
    return sum(deal_value(a, b, strategy_p0, strategy_p1) for a, b in deals) * Fraction(1, len(deals))


def best_response_value(strategy: Strategy, br_player: int) -> float:
    """The most `br_player` (0 = first, 1 = second) can win per round against the other player's part of
    `strategy`. A pure best response always exists, so the maximum is taken over the 64 pure strategies."""
    keys = FIRST_PLAYER_INFOSETS if br_player == 0 else SECOND_PLAYER_INFOSETS
    values = []
    for choice in itertools.product((0, 1), repeat=len(keys)):
        pure = dict(zip(keys, choice))
        values.append(game_value(pure, strategy) if br_player == 0 else -game_value(strategy, pure))
    return max(values)


def exploitability(strategy: Strategy) -> float:
    """NashConv / 2: the mean of what a best response wins against the strategy's first-player part and
    against its second-player part. Zero exactly at an equilibrium, positive otherwise (chips per round)."""
    return (best_response_value(strategy, 0) + best_response_value(strategy, 1)) / 2


def aggressive_probability(logprobs: Mapping[str, float]) -> float:
    """Probability of the aggressive action given per-action log-probs over the two legal actions.

    Keys are action strings such as "[bet]" or "bet" (case-insensitive); the log-probs are renormalised over
    the actions given, so the model's mass on anything else is ignored.
    """
    normalised = {f"[{action.strip().strip('[]').lower()}]": lp for action, lp in logprobs.items()}
    aggressive = [a for a in normalised if a in AGGRESSIVE_ACTIONS]
    if len(aggressive) != 1:
        raise ValueError(f"expected exactly one of {AGGRESSIVE_ACTIONS} among {sorted(logprobs)}")
    top = max(normalised.values())
    weights = {a: math.exp(lp - top) for a, lp in normalised.items()}
    return weights[aggressive[0]] / sum(weights.values())


@dataclass(frozen=True)
class KuhnInfoSet:
    """One first-round information set and a real TextArena observation that reaches it.

    `player` is 0 for the first player, 1 for the second; `env_player_id` is the TextArena seat acting there.
    """

    key: str
    card: str
    history: str
    player: int
    env_player_id: int
    seed: int
    observation: str
    legal_actions: tuple[str, ...]
    aggressive_action: str


def kuhn_information_sets(env_id: str = "KuhnPoker-v0-train", max_seeds: int = 1000) -> Iterator[KuhnInfoSet]:
    """Yield the 12 first-round information sets (in INFOSETS order), each with an observation obtained by
    resetting `env_id` with seeds 0, 1, ... until the acting player holds the card, then playing the history."""
    from unstable.games.episode import start_env  # imported here so the exact math above stays import-light
    from unstable.records import EnvSpec

    moves = {"c": "[check]", "b": "[bet]"}
    for key in INFOSETS:
        card, history = key[0], key[1:]
        for seed in range(max_seeds):
            env = start_env(EnvSpec(env_id, 2), seed)
            for letter in history:
                env.step(moves[letter])
            pid, observation = env.get_observation()
            if re.findall(r"Your card is: '([JQK])'", observation)[-1] == card:
                break
        else:
            raise RuntimeError(f"no seed below {max_seeds} deals {card} for information set {key!r}")
        legal = tuple(legal_moves(observation))
        aggressive = next(a for a in legal if a in AGGRESSIVE_ACTIONS)
        yield KuhnInfoSet(key, card, history, len(history) % 2, pid, seed, observation, legal, aggressive)
