"""Evaluation math: confidence intervals for win rates and exact exploitability of Kuhn Poker strategies."""

from unstable.evaluation.kuhn import (
    KuhnInfoSet,
    aggressive_probability,
    best_response_value,
    exploitability,
    game_value,
    kuhn_information_sets,
    nash_strategy,
)
from unstable.evaluation.stats import WDL, wilson_interval

__all__ = [
    "WDL",
    "KuhnInfoSet",
    "aggressive_probability",
    "best_response_value",
    "exploitability",
    "game_value",
    "kuhn_information_sets",
    "nash_strategy",
    "wilson_interval",
]
