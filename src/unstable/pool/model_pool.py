"""The opponent pool: the learner's checkpoints plus fixed opponents, with ratings updated after each game."""

from __future__ import annotations

import random
from dataclasses import dataclass

from unstable.pool.ratings import Rating, RatingSystem
from unstable.records import Checkpoint, GameRecord

SAMPLE_MODES = ("mirror", "fixed", "random", "lagged")


@dataclass(frozen=True)
class Opponent:
    """Who fills a seat: a policy checkpoint served by the inference engine, or a scripted/fixed agent."""

    agent_id: str
    checkpoint: Checkpoint | None = None
    fixed: str | None = None


class ModelPool:
    """Registers checkpoints, samples opponents by `sample_mode` and keeps a rating per agent.

    Modes: `mirror` (the latest checkpoint plays itself), `fixed` (a uniformly chosen fixed opponent),
    `random` (uniform over active checkpoints and fixed opponents), `lagged` (the previous checkpoint).
    Only the newest `max_active_lora` checkpoints are sampled, bounding the adapters the engine keeps.
    """

    def __init__(
        self,
        sample_mode: str = "mirror",
        fixed_opponents: list[str] | tuple[str, ...] = (),
        max_active_lora: int = 3,
        rating_backend: str = "openskill",
        seed: int = 0,
    ):
        if sample_mode not in SAMPLE_MODES:
            raise ValueError(f"unknown sample_mode {sample_mode!r}; valid: {list(SAMPLE_MODES)}")
        if sample_mode == "fixed" and not fixed_opponents:
            raise ValueError("sample_mode 'fixed' needs at least one entry in fixed_opponents")
        self.sample_mode = sample_mode
        self.fixed_opponents = list(fixed_opponents)
        self.max_active_lora = max_active_lora
        self.ratings = RatingSystem(rating_backend)
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
        return self.checkpoints[-self.max_active_lora :]

    def sample_opponent(self) -> Opponent:
        """Draw the opponent for one training game according to `sample_mode`."""
        latest = self.latest()
        if self.sample_mode == "mirror":
            return Opponent(latest.uid, checkpoint=latest)
        if self.sample_mode == "lagged":
            previous = self.checkpoints[-2] if len(self.checkpoints) > 1 else latest
            return Opponent(previous.uid, checkpoint=previous)
        if self.sample_mode == "fixed":
            return self._fixed(self._rng.choice(self.fixed_opponents))
        choices = [Opponent(c.uid, checkpoint=c) for c in self.active_checkpoints()]
        choices += [self._fixed(name) for name in self.fixed_opponents]
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

    def snapshot(self) -> dict:
        """Ratings and counters, for the tracker and the run directory."""
        return {
            "games_played": self.games_played,
            "checkpoints": [c.uid for c in self.checkpoints],
            "ratings": {k: {"mu": r.mu, "sigma": r.sigma} for k, r in self.ratings.ratings.items()},
        }

    @staticmethod
    def _fixed(name: str) -> Opponent:
        return Opponent(name, fixed=name)
