"""Opponent sampling modes: one function per mode, each returning the distribution it draws from as
(opponent, weight) pairs; the probability of an opponent is its weight over the sum of weights.

`SAMPLE_MODES` is the one registry of modes; `PoolConfig` validates `sample_mode` against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from unstable.pool.ratings import RatingSystem
from unstable.records import Checkpoint, Opponent


class ModelPool(Protocol):
    """What a sampling mode reads of `pool.ModelPool`."""

    cfg: Any  # its PoolConfig (the modes read `lag`)
    ratings: RatingSystem
    fixed_opponents: list[Opponent]

    def latest(self) -> Checkpoint: ...

    def active_checkpoints(self) -> list[Checkpoint]: ...


Distribution = list[tuple[Opponent, float]]
"""(opponent, weight) pairs; an opponent is drawn with probability weight / sum of weights."""


def _as_opponent(checkpoint: Checkpoint) -> Opponent:
    return Opponent(checkpoint.uid, checkpoint=checkpoint)


def _uniform(opponents: Iterable[Opponent]) -> Distribution:
    return [(opponent, 1.0) for opponent in opponents]


def _weighted_candidates(pool: ModelPool, weight: Callable[[str, str], float]) -> Distribution:
    """Candidates (active checkpoints other than the latest, then fixed opponents) weighted by
    `weight(latest uid, candidate agent id)`; the latest checkpoint alone when there is no candidate."""
    latest = pool.latest()
    candidates = [_as_opponent(c) for c in pool.active_checkpoints()[:-1]] + pool.fixed_opponents
    if not candidates:
        return [(_as_opponent(latest), 1.0)]
    return [(c, weight(latest.uid, c.agent_id)) for c in candidates]


def _mirror(pool: ModelPool) -> Distribution:
    """The latest checkpoint plays itself."""
    return [(_as_opponent(pool.latest()), 1.0)]


def _lagged(pool: ModelPool) -> Distribution:
    """Uniform over the `lag` checkpoints before the latest (all of them while fewer exist); the latest while
    there is none. `PoolConfig` keeps `lag < max_active_lora`, so these are always active."""
    previous = pool.active_checkpoints()[:-1][-pool.cfg.lag :]
    return _uniform(map(_as_opponent, previous or [pool.latest()]))


def _random(pool: ModelPool) -> Distribution:
    """Uniform over the active checkpoints (the latest included) and the fixed opponents."""
    return _uniform([_as_opponent(c) for c in pool.active_checkpoints()] + pool.fixed_opponents)


def _match_quality(pool: ModelPool) -> Distribution:
    """Over the candidates, P proportional to TrueSkill's 1v1 match quality with the latest checkpoint
    (`RatingSystem.match_quality`: sqrt(2 beta^2 / c^2) exp(-(mu_latest - mu)^2 / 2c^2),
    c^2 = 2 beta^2 + sigma_latest^2 + sigma^2)."""
    return _weighted_candidates(pool, pool.ratings.match_quality)


def _ts_dist(pool: ModelPool) -> Distribution:
    """Over the candidates, P proportional to exp(-|mu_latest - mu| / sqrt(beta^2 + sigma_latest^2 + sigma^2))
    (`RatingSystem.skill_gap`): closest skill first, and nearly uniform while the latest is barely rated."""
    return _weighted_candidates(pool, lambda latest, other: math.exp(-pool.ratings.skill_gap(latest, other)))


def _exploration(pool: ModelPool) -> Distribution:
    """Over the candidates, P proportional to sigma^2: the most uncertain ratings are played most."""
    return _weighted_candidates(pool, lambda latest, other: pool.ratings.get(other).sigma ** 2)


def _fixed(pool: ModelPool) -> Distribution:
    """Uniform over the fixed opponents."""
    return _uniform(pool.fixed_opponents)


SAMPLE_MODES: dict[str, Callable[[ModelPool], Distribution]] = {
    "mirror": _mirror,
    "lagged": _lagged,
    "random": _random,
    "match-quality": _match_quality,
    "ts-dist": _ts_dist,
    "exploration": _exploration,
    "fixed": _fixed,
}
"""Sampling mode name -> the (opponent, weight) distribution that `ModelPool.sample_opponent` draws from.
Candidates of the weighted modes: active checkpoints other than the latest, then the fixed opponents."""
