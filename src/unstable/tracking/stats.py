"""Small-sample statistics for game results: Wilson score intervals, win/draw/loss tallies and their summary."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0.0, 1.0) when n == 0 (nothing is known)."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else centre - half_width
    high = 1.0 if successes == n else centre + half_width
    return low, high


@dataclass(frozen=True)
class WDL:
    """Wins, draws and losses of one player over a set of games, with rates and their Wilson intervals."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @classmethod
    def from_outcomes(cls, outcomes: Iterable[str]) -> WDL:
        """Tally 'win' / 'draw' / 'loss' strings (as returned by GameRecord.outcome)."""
        outcomes = list(outcomes)
        unknown = set(outcomes) - {"win", "draw", "loss"}
        if unknown:
            raise ValueError(f"unknown outcomes {sorted(unknown)}; expected 'win', 'draw' or 'loss'")
        return cls(outcomes.count("win"), outcomes.count("draw"), outcomes.count("loss"))

    @property
    def n(self) -> int:
        """Number of games."""
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        """Fraction of games won (0.0 when there are none)."""
        return self.wins / self.n if self.n else 0.0

    @property
    def draw_rate(self) -> float:
        """Fraction of games drawn (0.0 when there are none)."""
        return self.draws / self.n if self.n else 0.0

    @property
    def loss_rate(self) -> float:
        """Fraction of games lost (0.0 when there are none)."""
        return self.losses / self.n if self.n else 0.0

    def win_interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson interval for the win rate."""
        return wilson_interval(self.wins, self.n, z)

    def draw_interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson interval for the draw rate."""
        return wilson_interval(self.draws, self.n, z)

    def loss_interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson interval for the loss rate."""
        return wilson_interval(self.losses, self.n, z)


def wdl_summary(outcomes: Iterable[str]) -> dict[str, Any]:
    """Counts, rates and 95% Wilson intervals of 'win' / 'draw' / 'loss' outcomes, JSON-ready: games, wins,
    draws, losses, win_rate, draw_rate, loss_rate and win_ci, draw_ci, loss_ci as [low, high] lists."""
    wdl = WDL.from_outcomes(outcomes)
    return {
        "games": wdl.n,
        "wins": wdl.wins,
        "draws": wdl.draws,
        "losses": wdl.losses,
        "win_rate": wdl.win_rate,
        "draw_rate": wdl.draw_rate,
        "loss_rate": wdl.loss_rate,
        "win_ci": list(wdl.win_interval()),
        "draw_ci": list(wdl.draw_interval()),
        "loss_ci": list(wdl.loss_interval()),
    }


# Student's t quantile t_{0.975, df} for df = 1..30 (two-sided 95%); larger df use the normal 1.96
_T_975 = (
    (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
    + (2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
    + (2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
)


def mean_interval(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean of `values` and its two-sided 95% Student-t interval, `(mean, low, high)`; a single value has the
    unbounded interval (-inf, inf): one seed says nothing about the spread between seeds."""
    values = list(values)
    if not values:
        raise ValueError("mean_interval needs at least one value")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, -math.inf, math.inf
    df = len(values) - 1
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / df)
    half = (_T_975[df - 1] if df <= len(_T_975) else 1.96) * std / math.sqrt(len(values))
    return mean, mean - half, mean + half
