"""The opponent pool: the learner's checkpoints plus fixed opponents, with ratings updated after each game."""

from __future__ import annotations

import random
from typing import Any

from unstable.agents.seating import parse_opponent
from unstable.pool.config import PoolConfig
from unstable.pool.ratings import Rating, RatingSystem
from unstable.records import Checkpoint, GameRecord, Opponent
from unstable.tracking import keys

SAMPLE_MODES = ("mirror", "fixed", "random", "lagged")


class ModelPool:
    """Registers checkpoints, samples opponents by `cfg.sample_mode` and keeps a rating per agent.

    Modes: `mirror` (the latest checkpoint plays itself), `fixed` (a uniformly chosen fixed opponent),
    `random` (uniform over active checkpoints and fixed opponents), `lagged` (the previous checkpoint).
    Only the newest `max_active_lora` checkpoints are sampled, bounding the adapters the engine keeps.
    """

    def __init__(self, cfg: PoolConfig | None = None, *, seed: int = 0):
        self.cfg = cfg or PoolConfig()
        self.ratings = RatingSystem(self.cfg.rating_backend)
        self.fixed_opponents = [parse_opponent(name) for name in self.cfg.fixed_opponents]
        self.checkpoints: list[Checkpoint] = []
        self.games_played = 0
        self._rng = random.Random(seed)

    def add_checkpoint(self, path: str | None, iteration: int, kind: str = "lora") -> Checkpoint:
        """Register a new learner checkpoint (path None = base model); it inherits its parent's mu."""
        checkpoint = Checkpoint(uid=f"ckpt-{iteration}", path=path, version=iteration, kind=kind)
        if self.checkpoints:
            parent = self.ratings.get(self.checkpoints[-1].uid)
            self.ratings.set(checkpoint.uid, Rating(parent.mu, min(2 * parent.sigma, Rating().sigma)))
        self.checkpoints.append(checkpoint)
        return checkpoint

    def latest(self) -> Checkpoint:
        """The newest checkpoint: what the learning seat plays with."""
        if not self.checkpoints:
            raise RuntimeError("ModelPool has no checkpoint: call add_checkpoint(path=None, iteration=-1) first")
        return self.checkpoints[-1]

    def active_checkpoints(self) -> list[Checkpoint]:
        """The newest `max_active_lora` checkpoints."""
        return self.checkpoints[-self.cfg.max_active_lora :]

    def sample_opponent(self) -> Opponent:
        """Draw the opponent for one training game according to `sample_mode`."""
        latest = self.latest()
        mode = self.cfg.sample_mode
        if mode == "mirror":
            return Opponent(latest.uid, checkpoint=latest)
        if mode == "lagged":
            previous = self.checkpoints[-2] if len(self.checkpoints) > 1 else latest
            return Opponent(previous.uid, checkpoint=previous)
        if mode == "fixed":
            return self._rng.choice(self.fixed_opponents)
        choices = [Opponent(c.uid, checkpoint=c) for c in self.active_checkpoints()]
        choices += self.fixed_opponents
        return self._rng.choice(choices)

    def sample_match(self) -> tuple[Checkpoint, Opponent]:
        """The learner's checkpoint and its opponent for one training game, in one call."""
        return self.latest(), self.sample_opponent()

    def record_game(self, record: GameRecord) -> None:
        """Update ratings from a finished game (failed games and self-play mirrors change nothing)."""
        if record.failed:
            return
        self.games_played += 1
        scores: dict[str, float] = {}
        for pid, agent_id in record.players.items():
            scores[agent_id] = scores.get(agent_id, 0.0) + record.rewards.get(pid, 0.0)
        self.ratings.rate(scores)

    def metrics(self) -> dict[str, Any]:
        """Games rated, checkpoints, the latest checkpoint's rating and the ladder (best conservative first)."""
        ladder = sorted(self.ratings.ratings.items(), key=lambda item: -item[1].conservative)
        latest = self.ratings.get(self.latest().uid) if self.checkpoints else Rating()
        return {
            keys.POOL_GAMES_RATED: self.games_played,
            keys.POOL_CHECKPOINTS: len(self.checkpoints),
            keys.POOL_LATEST_MU: latest.mu,
            keys.POOL_LATEST_SIGMA: latest.sigma,
            keys.POOL_LADDER: [
                {"agent": agent, "mu": r.mu, "sigma": r.sigma, "conservative": r.conservative} for agent, r in ladder
            ],
        }
