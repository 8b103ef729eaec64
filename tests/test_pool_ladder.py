"""The rated pool ranks what it measures: chains of scripted "checkpoints" of known, graded skill play real TicTacToe
games through the ModelPool as the collector does (the newest checkpoint in the learner seat, seats alternating,
against opponents the pool samples; the anchor 'random' fixed), and the ladder must order them by that skill."""

import itertools

import pytest

from unstable.agents.scripted import make_scripted_agent
from unstable.games.episode import play_episode
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import Checkpoint, EnvSpec, Opponent
from unstable.tracking import keys

pytestmark = pytest.mark.slow  # simulates thousands of rated games

SPEC = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
# tictactoe-minimax:epsilon=e plays a random empty cell with probability e, else perfectly. Against random (600 games
# each): epsilon 1.0, 0.8, 0.6, 0.4, 0.2, 0.0 win 0.42, 0.49, 0.59, 0.70, 0.78, 0.87 (the rest mostly draws)
IMPROVING = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
COLLAPSING = (0.0, 1.0, 0.8, 0.6, 0.4, 0.2)  # a strong start, a collapse, a slow recovery: RL runs do this too
FAR = 0.6  # three grades apart: about 0.3 apart in win rate against random


class ScriptedChain:
    """A ModelPool whose checkpoints are scripted agents; `play` runs one game the way the collector does."""

    def __init__(self, cfg: PoolConfig, seed: int = 0):
        self.pool = ModelPool(cfg, seed=seed)
        self.epsilon: dict[str, float] = {}
        self._games = itertools.count(1_000_003 * seed)

    def register(self, epsilon: float) -> str:
        """Add the next checkpoint, playing as tictactoe-minimax with this epsilon; returns its uid."""
        uid = self.pool.add_checkpoint(f"/ckpt/{len(self.epsilon)}", len(self.epsilon) - 1).uid
        self.epsilon[uid] = epsilon
        return uid

    def play(self, opponent: Opponent | None = None) -> None:
        """The latest checkpoint against `opponent` (default: one the pool samples, as in a training game)."""
        index = next(self._games)
        learner, (other,) = (self.pool.latest(), [opponent]) if opponent else self.pool.sample_match(1)
        seat = index % 2  # every checkpoint plays both seats
        agents = {seat: self._agent(learner.uid, 2 * index), 1 - seat: self._agent(other.agent_id, 2 * index + 1)}
        self.pool.record_game(play_episode(SPEC, agents, index))

    def evaluate(self, games: int) -> None:
        """`games` games of the latest checkpoint against the anchor, as an evaluation does."""
        for _ in range(games):
            self.play(self.pool.fixed_opponents[0])

    def _agent(self, agent_id: str, seed: int):
        if agent_id not in self.epsilon:
            return make_scripted_agent(agent_id, seed)
        agent = make_scripted_agent(f"tictactoe-minimax:epsilon={self.epsilon[agent_id]}", seed)
        agent.name = agent_id  # the record names the checkpoint, as a PolicyAgent would
        return agent

    def ladder(self) -> list[dict]:
        return self.pool.metrics()[keys.POOL_LADDER]


def _pool_cfg(mode: str, active: int) -> PoolConfig:
    return PoolConfig(sample_mode=mode, fixed_opponents=["random"], rating_anchor="random", max_active_lora=active)


@pytest.mark.parametrize("order", [IMPROVING, COLLAPSING], ids=["improving", "collapsing"])
@pytest.mark.parametrize("mode, active", [("random", 1), ("match-quality", 3)], ids=["demo-random", "match-quality"])
def test_the_ladder_ranks_a_chain_of_graded_checkpoints_in_order(order, mode, active):
    """The first checkpoint is rated on 200 games against the anchor (the initial evaluation; the demo plays 1,000),
    then each later one on 100 games in the learner seat (in the demo's 'random' mode about half are mirror games,
    which rate nothing). In order: no two checkpoints three or more grades apart are ranked the wrong way round;
    neighbours may swap, as ~50 games cannot separate 0.1 in win rate (the standard error is ~0.07)."""
    chain = ScriptedChain(_pool_cfg(mode, active))
    chain.register(order[0])
    chain.evaluate(200)
    for epsilon in order[1:]:
        chain.register(epsilon)
        for _ in range(100):
            chain.play()
    ranked = [chain.epsilon[e["agent"]] for e in chain.ladder() if e["agent"] in chain.epsilon]
    inverted = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1 :] if a - b >= FAR - 1e-9]
    assert not inverted, f"ladder order by epsilon {ranked}: (above, below) pairs out of order {inverted}"


def test_short_lived_checkpoints_stay_provisional_below_the_measured_ones():
    """The demo's shape: the first checkpoint measured on 200 games, 24 short-lived checkpoints of rising skill that
    play 16 training games each (about 8 rated, the rest mirror games), and the last, as strong as the strongest,
    measured on 300 more (the final evaluation). The measured agents lead the ladder, the strongest first, and no
    barely rated checkpoint shows odds against the latest: the best of 24 ratings from 8 games is mostly luck."""
    chain = ScriptedChain(_pool_cfg("random", 1))
    base = chain.register(1.0)
    chain.evaluate(200)
    for epsilon in [0.8] * 6 + [0.6] * 6 + [0.4] * 6 + [0.2] * 6:
        chain.register(epsilon)
        for _ in range(16):
            chain.play()
    final = chain.pool.latest().uid
    chain.evaluate(300)
    ladder = chain.ladder()
    assert ladder[0]["agent"] == final
    top = [(e["agent"], e.get("games"), round(e["conservative"], 1)) for e in ladder[:6]]
    assert {e["agent"] for e in ladder[:3]} == {final, base, "random"}, f"(agent, games, mu - 3 sigma): {top}"
    short_lived = ladder[3:]
    assert all(e["provisional"] and e["games"] < 30 for e in short_lived)
    shown = {e["agent"]: e["win_probability"] for e in ladder if e["win_probability"] is not None}
    assert set(shown) == {final, base, "random"} and shown[final] == pytest.approx(0.5)
    assert shown[base] < 0.4 and shown["random"] < 0.4  # both play like random; the final wins ~0.78 against it


def _bounded_chain(max_retired: int) -> ScriptedChain:
    """10 checkpoints: the first measured on 200 games against the anchor (a warm start's evaluation), the others,
    of mixed skill, on 40 training games each and more as opponents (ranked from 60 games: some are, some not),
    3 active at a time."""
    cfg = _pool_cfg("match-quality", 3).model_copy(update={"max_retired": max_retired, "ladder_min_games": 60})
    chain = ScriptedChain(cfg)
    chain.register(0.4)
    chain.evaluate(200)
    for epsilon in (1.0, 0.2, 0.8, 0.0, 0.6, 1.0, 0.2, 0.4, 0.8):
        chain.register(epsilon)
        for _ in range(40):
            chain.play()
    return chain


def test_the_pool_forgets_the_lowest_retired_checkpoints_beyond_max_retired():
    """With 3 active checkpoints and `max_retired` 2, the pool keeps the anchor, the 3 newest and the 2 best-ranked
    retired checkpoints (the unbounded pool of the same games ranks them the same), forgets the others everywhere,
    still counts all 10 it registered, and a late result of a forgotten checkpoint (a game in flight when it was
    forgotten) does not bring the tables over the bound."""
    bounded, unbounded = _bounded_chain(max_retired=2), _bounded_chain(max_retired=100)
    pool, full = bounded.pool, unbounded.pool
    active = [c.uid for c in pool.active_checkpoints()]
    retired = [e["agent"] for e in unbounded.ladder() if e["agent"] not in active and e["agent"] != "random"]
    kept = {"random", *active, *retired[:2]}
    provisional = {e["agent"] for e in unbounded.ladder() if e["provisional"]}
    assert len(retired) == 7 and provisional & set(retired) and "ckpt--1" in retired[:2]  # the warm start is kept
    assert set(pool.ratings.ratings) == kept
    assert [c.uid for c in pool.checkpoints] == sorted(kept - {"random"}, key=lambda uid: int(uid[len("ckpt-") :]))
    assert set(pool.matches.counts) == kept and all(set(row) <= kept for row in pool.matches.counts.values())
    assert bounded.ladder() == [e for e in unbounded.ladder() if e["agent"] in kept]  # the same ratings, fewer rows
    metrics = pool.metrics()
    assert metrics[keys.POOL_CHECKPOINTS] == 10 == full.metrics()[keys.POOL_CHECKPOINTS]
    assert set(metrics[keys.POOL_MATCH_MATRIX]) == kept

    restored = ModelPool(pool.cfg)
    restored.load_state_dict(pool.state_dict())
    assert restored.metrics() == metrics and restored.state_dict() == pool.state_dict()
    unbounded_state = {key: value for key, value in full.state_dict().items() if key != "registered"}  # of before
    restored.load_state_dict(unbounded_state)  # cut to the bound at once: the same as one at a time
    assert restored.metrics()[keys.POOL_LADDER] == metrics[keys.POOL_LADDER]
    assert restored.matches.counts == pool.matches.counts and restored.checkpoints == pool.checkpoints
    assert restored.metrics()[keys.POOL_CHECKPOINTS] == 10  # its list held every checkpoint

    forgotten = retired[-1]
    bounded.play(Opponent(forgotten, checkpoint=Checkpoint(forgotten)))  # its late result
    assert len(pool.ratings.ratings) <= 6 and len(pool.matches.counts) <= 6
