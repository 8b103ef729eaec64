"""The opponent pool: the learner's checkpoints plus fixed opponents, with ratings updated after each game.

How each training game's opponent is drawn is one function of `pool.sampling.SAMPLE_MODES` per mode.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict
from typing import Any

from unstable.agents.seating import parse_opponent
from unstable.pool.config import PoolConfig
from unstable.pool.ratings import MatchMatrix, Rating, RatingSystem
from unstable.pool.sampling import SAMPLE_MODES
from unstable.records import Checkpoint, GameRecord, Opponent, checkpoint_uid
from unstable.tracking import keys
from unstable.tracking.history import agent_order


class ModelPool:
    """Registers checkpoints, samples opponents by `cfg.sample_mode` (see `SAMPLE_MODES`), rates every game.

    Only the newest `max_active_lora` checkpoints are active (sampled as opponents), bounding the adapters the
    inference engine keeps. Of the retired ones, the `max_retired` highest on the ladder keep their ratings and
    match-matrix rows; the others are forgotten (`registered` still counts them), bounding the tables and the state.
    """

    def __init__(self, cfg: PoolConfig | None = None, *, seed: int = 0):
        self.cfg = cfg or PoolConfig()
        anchors = frozenset([self.cfg.rating_anchor] if self.cfg.rating_anchor else [])
        self.ratings = RatingSystem(self.cfg.rating_backend, beta=self.cfg.beta, anchors=anchors)
        self.matches = MatchMatrix()
        self.fixed_opponents = [parse_opponent(name) for name in self.cfg.fixed_opponents]
        self.checkpoints: list[Checkpoint] = []
        self.registered = 0
        self.games_played = 0
        self._rng = random.Random(seed)
        self._in_play: Counter[int] = Counter()  # checkpoint version -> games in flight playing it (not saved)

    def add_checkpoint(self, path: str | None, iteration: int, kind: str = "lora") -> Checkpoint:
        """Register a new learner checkpoint (path None = base model). It starts from the rating prior, as a new
        player does (the anchor's mu, sigma 25/3), not from its parent's rating: its rating then measures its own
        games, and its games count says how many. (An inherited rating carried the lineage's results and a sigma
        that claimed them as the checkpoint's own, so short-lived checkpoints outranked well-measured ones.)"""
        checkpoint = Checkpoint(uid=checkpoint_uid(iteration), path=path, version=iteration, kind=kind)
        self.checkpoints.append(checkpoint)
        self.registered += 1
        self._forget_retired()
        return checkpoint

    def hold(self, versions: list[int]) -> None:
        """A game starts playing the checkpoints of `versions` (one entry per seat it plays): their folders stay
        until it ends (`release`), however many updates retention has let them go by."""
        self._in_play.update(versions)

    def release(self, versions: list[int]) -> None:
        """The game that `hold` named `versions` for ended."""
        self._in_play.subtract(versions)
        self._in_play = +self._in_play  # drop the zeros

    def in_play(self) -> list[int]:
        """The versions of the checkpoints games in flight play."""
        return sorted(self._in_play)

    def latest(self) -> Checkpoint:
        """The newest checkpoint: what the learning seat plays with."""
        if not self.checkpoints:
            raise RuntimeError("ModelPool has no checkpoint: call add_checkpoint(path=None, iteration=-1) first")
        return self.checkpoints[-1]

    def active_checkpoints(self) -> list[Checkpoint]:
        """The newest `max_active_lora` checkpoints, oldest first."""
        return self.checkpoints[-self.cfg.max_active_lora :]

    def sample_opponent(self) -> Opponent:
        """Draw one opponent from the distribution of `cfg.sample_mode`."""
        opponents, weights = zip(*SAMPLE_MODES[self.cfg.sample_mode](self))
        return self._rng.choices(opponents, weights)[0]

    def sample_match(self, num_opponents: int = 1) -> tuple[Checkpoint, list[Opponent]]:
        """The learner's checkpoint and one independently drawn opponent per other seat."""
        if num_opponents < 0:
            raise ValueError(f"num_opponents must be >= 0, got {num_opponents}")
        return self.latest(), [self.sample_opponent() for _ in range(num_opponents)]

    def record_game(self, record: GameRecord) -> None:
        """Rate a finished game (failed games are skipped) and count it in the match matrix.

        Seats with the same agent id are one agent scoring the sum of their rewards. A lone agent in a
        1-seat game plays the pseudo-agent `env:<env_id>`, which scores 0; mirror self-play over several
        seats changes no rating.
        """
        if record.failed:
            return
        self.games_played += 1
        scores = _agent_scores(record)
        if len(scores) == 1 and len(record.players) > 1:
            return
        if len(scores) == 1:
            scores[f"env:{record.env_id}"] = 0.0
        self.ratings.rate(scores)
        self.matches.add(scores)
        self._forget_retired()

    def state_dict(self) -> dict[str, Any]:
        """Checkpoints (those kept, and the count of all registered), ratings, match counts, games rated and the
        sampling RNG, for resume."""
        return {
            "checkpoints": [asdict(c) for c in self.checkpoints],
            "registered": self.registered,
            "ratings": self.ratings.state_dict(),
            "matches": self.matches.counts,
            "games_played": self.games_played,
            "rng": self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (replacing every registered checkpoint). A state saved before the
        pool forgot checkpoints lists every one it registered, and is cut to `cfg.max_retired` at once."""
        self.checkpoints = [Checkpoint(**c) for c in state["checkpoints"]]
        self.registered = state.get("registered", len(self.checkpoints))
        self.ratings.load_state_dict(state["ratings"])
        self.matches.counts = state["matches"]
        self.games_played = state["games_played"]
        self._rng.setstate(state["rng"])
        self._forget_retired()

    def metrics(self) -> dict[str, Any]:
        """Games recorded, checkpoints, the latest checkpoint's rating, the ladder and the match matrix."""
        latest = self.checkpoints[-1].uid if self.checkpoints else None
        rating = self.ratings.get(latest) if latest else Rating()
        return {
            keys.POOL_GAMES_RATED: self.games_played,
            keys.POOL_CHECKPOINTS: self.registered,
            keys.POOL_ACTIVE_CHECKPOINTS: len(self.active_checkpoints()),
            keys.POOL_LATEST_MU: rating.mu,
            keys.POOL_LATEST_SIGMA: rating.sigma,
            keys.POOL_LADDER: self._ladder(latest),
            keys.POOL_MATCH_MATRIX: self.matches.table(),
        }

    def _ranked(self, agent: str) -> bool:
        """True for an anchor and for an agent rated on at least `cfg.ladder_min_games` games; the others are
        provisional: a rating from a few games is mostly the prior and luck (the best of many such ratings is
        luck above all)."""
        return agent in self.ratings.anchors or self.ratings.get(agent).games >= self.cfg.ladder_min_games

    def _ladder_key(self, agent: str) -> tuple[bool, float]:
        """The ladder's order, highest first: the ranked agents by conservative score (mu - 3 sigma), then the
        provisional ones the same way."""
        return not self._ranked(agent), -self.ratings.get(agent).conservative

    def _retired(self) -> list[str]:
        """The checkpoints older than the active ones, oldest first; after the registered ones, any rated only by a
        late result (a game in flight when its checkpoint was forgotten, which rated it afresh)."""
        kept = [c.uid for c in self.checkpoints]
        known = set(kept)
        late = [agent for agent in self.ratings.ratings if agent not in known and agent_order(agent)[0] == 0]
        active = {c.uid for c in self.active_checkpoints()}
        return [uid for uid in kept + late if uid not in active]

    def _forget_retired(self) -> None:
        """Forget the retired checkpoints lowest on the ladder (of equals, the oldest) beyond `cfg.max_retired`:
        they can never be sampled again, so only the ladder and the match matrix still name them. (Their ratings no
        longer change, so forgetting the lowest one at a time keeps the same ones as this cut of all at once.)"""
        retired = self._retired()
        excess = len(retired) - self.cfg.max_retired
        if excess <= 0:
            return
        forgotten = set(sorted(retired, key=self._ladder_key, reverse=True)[:excess])  # stable: ties oldest first
        self.checkpoints = [c for c in self.checkpoints if c.uid not in forgotten]
        self.ratings.forget(forgotten)
        self.matches.forget(forgotten)

    def _ladder(self, latest: str | None) -> list[dict[str, Any]]:
        """Every rated agent in `_ladder_key` order; odds and match quality against the latest checkpoint only where
        both are ranked (else None)."""
        order = sorted(self.ratings.ratings, key=self._ladder_key)
        latest_ranked = latest is not None and self._ranked(latest)
        ladder = []
        for agent in order:
            r = self.ratings.get(agent)
            against_latest = latest_ranked and self._ranked(agent)
            ladder.append(
                {
                    "agent": agent,
                    "mu": r.mu,
                    "sigma": r.sigma,
                    "conservative": r.conservative,
                    "games": r.games,
                    "provisional": not self._ranked(agent),
                    "win_probability": self.ratings.win_probability(agent, latest) if against_latest else None,
                    "match_quality": self.ratings.match_quality(agent, latest) if against_latest else None,
                }
            )
        return ladder


def _agent_scores(record: GameRecord) -> dict[str, float]:
    """Each distinct agent's summed reward over the seats it played."""
    scores: dict[str, float] = {}
    for pid, agent_id in record.players.items():
        scores[agent_id] = scores.get(agent_id, 0.0) + record.rewards.get(pid, 0.0)
    return scores
