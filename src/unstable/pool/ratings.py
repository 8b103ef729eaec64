"""Skill ratings behind a small interface (trueskill, UnstableBaselines' choice, or openskill), and the
head-to-head match matrix."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from unstable.settings import check_registered

RATING_BACKENDS = ("openskill", "trueskill")
DEFAULT_MU = 25.0
DEFAULT_SIGMA = 25.0 / 3.0
ANCHOR_SIGMA = 1.0  # an anchor's skill is the scale's zero point, known rather than estimated


@dataclass(frozen=True)
class Rating:
    """A Gaussian skill estimate and the number of rated games it rests on (the default: a new player's prior)."""

    mu: float = DEFAULT_MU
    sigma: float = DEFAULT_SIGMA
    games: int = 0

    @property
    def conservative(self) -> float:
        """mu - 3 sigma: the leaderboard value."""
        return self.mu - 3.0 * self.sigma


class RatingSystem:
    """Rates free-for-all results; `backend` is 'trueskill' (`trueskill.TrueSkill(beta=beta)`) or 'openskill'
    (Plackett-Luce with the same beta). `beta` is the performance noise: a skill gap of beta wins ~76%. Agents in
    `anchors` hold the rating (DEFAULT_MU, ANCHOR_SIGMA) whatever their results: the fixed reference the others are
    measured against (a small sigma, so that a game against it is judged on the performance noise beta alone); every
    other agent starts from the prior (DEFAULT_MU, DEFAULT_SIGMA), so DEFAULT_MU is the anchor's level."""

    def __init__(self, backend: str = "trueskill", beta: float = 4.0, anchors: frozenset[str] = frozenset()):
        check_registered(backend, RATING_BACKENDS, "rating backend")
        self.backend = backend
        self.beta = beta
        self.anchors = anchors
        self.ratings: dict[str, Rating] = {agent: Rating(DEFAULT_MU, ANCHOR_SIGMA) for agent in anchors}
        if backend == "openskill":
            from openskill.models import PlackettLuce

            self._model = PlackettLuce(mu=DEFAULT_MU, sigma=DEFAULT_SIGMA, beta=beta)
        else:
            import trueskill

            self._model = trueskill.TrueSkill(mu=DEFAULT_MU, sigma=DEFAULT_SIGMA, beta=beta)

    def get(self, agent_id: str) -> Rating:
        """The rating of `agent_id` (the default prior if it was never rated or set)."""
        return self.ratings.get(agent_id, Rating())

    def set(self, agent_id: str, rating: Rating) -> None:
        """Overwrite a rating."""
        self.ratings[agent_id] = rating

    def forget(self, agents: Collection[str]) -> None:
        """Drop the ratings of `agents` (an anchor's never: it is the scale's zero point)."""
        if self.anchors & set(agents):
            raise ValueError(f"anchors cannot be forgotten: {sorted(self.anchors & set(agents))}")
        self.ratings = {agent: r for agent, r in self.ratings.items() if agent not in agents}

    def state_dict(self) -> dict[str, list[float]]:
        """Every rating as `{agent_id: [mu, sigma, games]}`."""
        return {agent: [r.mu, r.sigma, r.games] for agent, r in self.ratings.items()}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        """Restore what `state_dict` returned (a state saved before games were counted restores them as 0)."""
        self.ratings = {agent: Rating(*values) for agent, values in state.items()}

    def rate(self, scores: dict[str, float]) -> None:
        """Update every agent in one game from its final score (higher is better; equal scores draw) and count the
        game for each (an anchor's too, though its mu and sigma stay put)."""
        ids = list(scores)
        if len(ids) < 2:
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
        for agent_id, before, after in zip(ids, current, updated):
            kept = before if agent_id in self.anchors else after
            self.ratings[agent_id] = Rating(kept.mu, kept.sigma, before.games + 1)

    def win_probability(self, a: str, b: str) -> float:
        """P(a beats b) = Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2))."""
        ra, rb = self.get(a), self.get(b)
        denom = math.sqrt(2 * self.beta**2 + ra.sigma**2 + rb.sigma**2)
        return 0.5 * (1.0 + math.erf((ra.mu - rb.mu) / (denom * math.sqrt(2.0))))

    def skill_gap(self, a: str, b: str) -> float:
        """|mu_a - mu_b| / sqrt(beta^2 + sigma_a^2 + sigma_b^2): the mu gap in units of the performance noise beta,
        widened by both uncertainties (an unrated agent is close to everyone)."""
        ra, rb = self.get(a), self.get(b)
        return abs(ra.mu - rb.mu) / math.sqrt(self.beta**2 + ra.sigma**2 + rb.sigma**2)

    def match_quality(self, a: str, b: str) -> float:
        """TrueSkill's 1v1 draw-probability quality: sqrt(2 beta^2 / c^2) exp(-(mu_a - mu_b)^2 / 2c^2)."""
        ra, rb = self.get(a), self.get(b)
        c2 = 2 * self.beta**2 + ra.sigma**2 + rb.sigma**2
        return math.sqrt(2 * self.beta**2 / c2) * math.exp(-((ra.mu - rb.mu) ** 2) / (2 * c2))


class MatchMatrix:
    """Head-to-head counts: for each ordered pair of distinct agents that met, games, wins and draws of the
    first against the second (a win: the first's summed reward in that game is higher than the second's)."""

    def __init__(self):
        self.counts: dict[str, dict[str, dict[str, int]]] = {}

    def add(self, scores: dict[str, float]) -> None:
        """Count one game from each agent's summed reward."""
        for agent, opponent in permutations(scores, 2):
            cell = self.counts.setdefault(agent, {}).setdefault(opponent, {"games": 0, "wins": 0, "draws": 0})
            cell["games"] += 1
            cell["wins"] += scores[agent] > scores[opponent]
            cell["draws"] += scores[agent] == scores[opponent]

    def forget(self, agents: Collection[str]) -> None:
        """Drop the rows of `agents` and their columns in every other row (a row left empty goes too)."""
        kept = {
            agent: {opponent: cell for opponent, cell in row.items() if opponent not in agents}
            for agent, row in self.counts.items()
            if agent not in agents
        }
        self.counts = {agent: row for agent, row in kept.items() if row}

    def table(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{agent: {opponent: {"games", "wins", "draws", "losses", "win_rate"}}}; win_rate = wins / games."""
        return {
            agent: {
                opponent: {
                    **cell,
                    "losses": cell["games"] - cell["wins"] - cell["draws"],
                    "win_rate": cell["wins"] / cell["games"],
                }
                for opponent, cell in row.items()
            }
            for agent, row in self.counts.items()
        }
