"""Skill ratings behind a small interface: openskill (default, fast) or trueskill (UnstableBaselines' choice)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from unstable.settings import check_registered

RATING_BACKENDS = ("openskill", "trueskill")
DEFAULT_MU = 25.0
DEFAULT_SIGMA = 25.0 / 3.0


@dataclass(frozen=True)
class Rating:
    """A Gaussian skill estimate."""

    mu: float = DEFAULT_MU
    sigma: float = DEFAULT_SIGMA

    @property
    def conservative(self) -> float:
        """mu - 3 sigma: the leaderboard value."""
        return self.mu - 3.0 * self.sigma


class RatingSystem:
    """Rates free-for-all results; `backend` is 'openskill' (Plackett-Luce) or 'trueskill'."""

    def __init__(self, backend: str = "openskill", beta: float = 25.0 / 6.0):
        check_registered(backend, RATING_BACKENDS, "rating backend")
        self.backend = backend
        self.beta = beta
        self.ratings: dict[str, Rating] = {}
        if backend == "openskill":
            from openskill.models import PlackettLuce

            self._model = PlackettLuce(beta=beta)
        else:
            import trueskill

            self._model = trueskill.TrueSkill(beta=beta, draw_probability=0.1)

    def get(self, agent_id: str) -> Rating:
        """The rating of `agent_id` (a fresh default rating if never seen)."""
        return self.ratings.setdefault(agent_id, Rating())

    def set(self, agent_id: str, rating: Rating) -> None:
        """Overwrite a rating (e.g. a new checkpoint inheriting its parent's)."""
        self.ratings[agent_id] = rating

    def rate(self, scores: dict[str, float]) -> None:
        """Update every agent in one game from its final score (higher is better; equal scores draw)."""
        ids = list(scores)
        if len(set(ids)) < 2:
            return
        current = [self.get(i) for i in ids]
        ranks = [-scores[i] for i in ids]  # lower rank = better
        if self.backend == "openskill":
            teams = [[self._model.rating(mu=r.mu, sigma=r.sigma)] for r in current]
            new = self._model.rate(teams, ranks=ranks)
            updated = [Rating(t[0].mu, t[0].sigma) for t in new]
        else:
            groups = [(self._model.create_rating(r.mu, r.sigma),) for r in current]
            new = self._model.rate(groups, ranks=ranks)
            updated = [Rating(g[0].mu, g[0].sigma) for g in new]
        for agent_id, rating in zip(ids, updated):
            self.ratings[agent_id] = rating

    def win_probability(self, a: str, b: str) -> float:
        """P(a beats b) = Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2))."""
        ra, rb = self.get(a), self.get(b)
        denom = math.sqrt(2 * self.beta**2 + ra.sigma**2 + rb.sigma**2)
        return 0.5 * (1.0 + math.erf((ra.mu - rb.mu) / (denom * math.sqrt(2.0))))

    def match_quality(self, a: str, b: str) -> float:
        """TrueSkill's 1v1 draw-probability quality: sqrt(2 beta^2 / c^2) exp(-(mu_a - mu_b)^2 / 2c^2)."""
        ra, rb = self.get(a), self.get(b)
        c2 = 2 * self.beta**2 + ra.sigma**2 + rb.sigma**2
        return math.sqrt(2 * self.beta**2 / c2) * math.exp(-((ra.mu - rb.mu) ** 2) / (2 * c2))
