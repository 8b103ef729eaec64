"""The Collector: keeps `num_workers` training games and `num_eval_workers` eval games in flight.

Games are plain `play_episode` calls on a thread pool (they spend their time waiting for the inference
engine, so threads cost little and no process per game is needed). Each finished training game goes to the
StepBuffer and the ModelPool's ratings; every game's summary goes to the Tracker; then a new game starts.
The learner's seat always plays the pool's latest checkpoint, so a new checkpoint is picked up by the very
next game while games already running finish on the adapter they started with.

With `group_size` G > 1 each training game branches into G continuations from a copied decision state
(`games.branching`): every branch goes to the StepBuffer, while ratings and the Tracker see only the first,
whole game (the branches share its prefix, so they are not independent games).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from unstable.agents.policy import GenerationClient, PolicyAgent
from unstable.agents.seating import make_agent, parse_opponent, seat_agents
from unstable.buffer.step_buffer import steps_to_add
from unstable.collector.config import EVAL_CONCURRENCY, CollectorConfig
from unstable.collector.pacing import HeldSlots, Pacing
from unstable.collector.vine_stats import VineStats
from unstable.games.branching import play_branched_episode
from unstable.games.episode import play_episode
from unstable.games.templates import get_template
from unstable.games.vines import play_vined_episode
from unstable.records import GameRecord, append_games
from unstable.tracking import keys
from unstable.tracking.tracker import summarize_game

log = logging.getLogger(__name__)

GAMES_PER_SESSION = 2**32  # more games than one session of a run plays

# test hook: a directory to which every training game's records (all its branches) are appended, one JSON list a
# line in `records.jsonl` (`records.append_games`), so a test of a whole run can read what its games saw (e.g. each
# branch's deals)
RECORDS_ENV = "UNSTABLE_TEST_RECORDS_DIR"
_RECORDS_FILE = threading.Lock()


def game_seed(run_seed: int, resume_step: int, index: int) -> int:
    """The seed of the `index`-th game of a session of the run seeded `run_seed` that started at learner step
    `resume_step` (0: the fresh run). Sessions get disjoint ranges of `GAMES_PER_SESSION` seeds, so a resumed run
    never replays the seeds of the games before it (its game counter starts at 0 again)."""
    return run_seed * 1_000_003 + resume_step * GAMES_PER_SESSION + index


class Collector:
    """Runs training and evaluation games concurrently and routes their results.

    Each game's seed is `game_seed(seed, resume_step, n)` for the n-th game this collector starts; its requests
    name it as their `game`, so an `InferenceClient` keeps the game on one server until it ends."""

    def __init__(
        self,
        client: GenerationClient,
        model_pool,
        step_buffer,
        tracker,
        cfg: CollectorConfig,
        *,
        tokenizer=None,
        seed=0,
        resume_step=0,
    ):
        self.client = client
        self.model_pool = model_pool
        self.step_buffer = step_buffer
        self.tracker = tracker
        self.cfg = cfg
        self.training_envs = cfg.training_specs()
        self.evaluation_envs = cfg.evaluation_specs()
        self.evaluation_opponents = [parse_opponent(name) for name in cfg.evaluation_opponents]
        self.tokenizer = tokenizer
        self.seed = seed
        self.resume_step = resume_step  # the learner step a resumed run restarted from (0: a fresh run)
        self._game_counter = itertools.count()
        self._stop = threading.Event()
        self._failed_in_a_row = 0  # training games, since the last one that did not fail
        self.pacing = Pacing(cfg.max_steps_per_game(), enabled=cfg.pacing)
        self.held_slots = HeldSlots()  # the time pacing keeps training slots empty, for the rows
        self.vine_stats = VineStats()

    def collect(self, num_workers: int, num_eval_workers: int = 0) -> dict[str, int]:
        """Keep the games in flight until `stop()` is called; returns how many games of each kind ran and how many
        of them failed (`train`, `eval`, `train_failed`, `eval_failed`).

        After `cfg.max_failed_games_in_a_row` failed training games in a row it stops collection through the
        StepBuffer, with the cause, so the learner waiting for a batch stops instead of waiting forever.

        Up to `num_workers` training games run at once; with `cfg.pacing` a free slot stays empty while
        its game's steps would not fit in the StepBuffer (see `collector.pacing`); the buffer is asked once per
        round, however many slots wait.
        """
        self._stop.clear()
        counts = {"train": 0, "eval": 0, "train_failed": 0, "eval_failed": 0}
        with ThreadPoolExecutor(max_workers=num_workers + num_eval_workers, thread_name_prefix="game") as pool:
            in_flight: dict[Future, str] = {}

            def start(kind: str) -> None:
                in_flight[pool.submit(self.play_one, kind == "eval")] = kind

            for _ in range(num_eval_workers):
                start("eval")
            waiting, arrived = 0, num_workers  # training slots left empty, and those freed in this round
            stopping = self._stopping()
            while True:
                waiting = 0 if stopping else self._start_training(waiting + arrived, arrived, in_flight, start)
                self.held_slots.set(num_workers, waiting)
                if not (in_flight or waiting):
                    break
                if in_flight:
                    done = wait(in_flight, timeout=0.2, return_when=FIRST_COMPLETED)[0]
                else:  # every training slot waits for the buffer
                    done = set()
                    self._stop.wait(0.2)
                stopping = self._stopping()  # one question per round, however many games finished
                arrived = 0
                for future in done:
                    kind = in_flight.pop(future)
                    counts[kind] += 1
                    failure = _failure(future)
                    counts[f"{kind}_failed"] += failure is not None
                    if kind == "train":
                        self._count_training_game(failure)
                        arrived += 1
                    elif not stopping:
                        start(kind)
        self.held_slots.set(0, 0)
        return counts

    def metrics(self) -> dict[str, float]:
        """The collector's own counters for the Tracker's rows: games held back by pacing, and the slot time held
        back since the previous call (the Tracker calls it once per row) with its share of all slots' time."""
        held, slots = self.held_slots.take()
        counts = {
            keys.GAMES_HELD_BACK: self.pacing.held_back,
            keys.HELD_BACK_SLOT_SECONDS: held,
            keys.HELD_BACK_SHARE: held / slots if slots else 0.0,
        }
        return counts | self.vine_stats.take() if self.cfg.vines.enabled else counts

    def _start_training(self, waiting: int, arrived: int, in_flight: dict[Future, str], start) -> int:
        """Start as many of the `waiting` training games (`arrived` of them freed in this round) as pacing allows;
        returns how many still wait."""
        if not waiting:
            return 0
        running = sum(kind == "train" for kind in in_flight.values())
        room = self.step_buffer.room() if self.pacing.enabled else 0
        starting = self.pacing.startable(waiting, running, room)
        for _ in range(starting):
            start("train")
        self.pacing.hold(arrived, waiting - starting)
        return waiting - starting

    def evaluate(self, num_games: int, concurrency: int = EVAL_CONCURRENCY) -> list[GameRecord]:
        """Play `num_games` eval games now (blocking), seats alternating; returns their records."""
        if num_games == 0:
            return []
        with ThreadPoolExecutor(max_workers=min(concurrency, num_games), thread_name_prefix="eval") as pool:
            return list(pool.map(lambda _: self.play_one(is_eval=True), range(num_games)))

    def _count_training_game(self, failure: str | None) -> None:
        """Count a finished training game (`failure`: why it failed, None if it did not); at the
        `max_failed_games_in_a_row`-th failure in a row, stop collection with the cause."""
        self._failed_in_a_row = self._failed_in_a_row + 1 if failure is not None else 0
        limit = self.cfg.max_failed_games_in_a_row
        if self._failed_in_a_row == limit:
            cause = (
                f"the last {limit} training games all failed (collector.max_failed_games_in_a_row = {limit}), "
                f"the last one with {failure}"
            )
            log.error("stopping collection: %s", cause)
            self.step_buffer.stop_collection(cause)

    def stop(self) -> None:
        """Let running games finish and start no new ones."""
        self._stop.set()

    def _stopping(self) -> bool:
        """True once `stop()` was called or the learner told the buffer that collection is over."""
        return self._stop.is_set() or self.step_buffer.collection_stopped()

    def play_one(self, is_eval: bool) -> GameRecord:
        """Play one game (training: latest checkpoint vs pool opponents; eval: vs the eval opponent in every
        other seat). Any number of players: 1-player games have no opponent, n-player games one per other seat."""
        index = next(self._game_counter)
        envs = self.evaluation_envs if is_eval else self.training_envs
        spec = envs[index % len(envs)]
        if is_eval:  # the opponents take turns, each meeting every env and seat
            rotation = index // (len(envs) * spec.num_players)
            opponent = self.evaluation_opponents[rotation % len(self.evaluation_opponents)]
            learner, opponents = self.model_pool.latest(), [opponent] * (spec.num_players - 1)
        else:
            learner, opponents = self.model_pool.sample_match(spec.num_players - 1)
        seed = game_seed(self.seed, self.resume_step, index)
        learner_seat = (index // len(envs)) % spec.num_players  # every env sees the learner in every seat
        opponent_of = dict(zip((pid for pid in range(spec.num_players) if pid != learner_seat), opponents))
        template = get_template(spec.prompt_template)
        agents, learner_ids = seat_agents(
            spec,
            learner_seat,
            lambda: PolicyAgent(self.client, learner, template, self.tokenizer, game=seed),
            lambda pid: make_agent(opponent_of[pid], self.client, template, self.tokenizer, seed + pid, game=seed),
            mirror=not is_eval and bool(opponents) and all(o.checkpoint == learner for o in opponents),
        )
        held = [c.version for c in (learner, *(o.checkpoint for o in opponents)) if c is not None]
        self.model_pool.hold(held)  # retention keeps their folders while the game plays them
        try:
            records = self._play(spec, agents, seed, is_eval, learner_ids, opponents)
        finally:
            self.client.end_game(seed)  # the inference client forgets the game's server
            self.model_pool.release(held)
        if not is_eval:
            if self.cfg.vines.enabled:
                self.vine_stats.add(records)
            for record in records:
                self.step_buffer.add_game(record)
            self.pacing.game_finished(sum(steps_to_add(record) for record in records))
            _write_for_test(records)
        self.model_pool.record_game(records[0])  # eval games rate the learner against fixed opponents too
        self.tracker.add_game(summarize_game(records[0], continuations=records[1:]))
        return records[0]

    def _play(self, spec, agents, seed: int, is_eval: bool, learner_ids, opponents) -> list[GameRecord]:
        """Play one game: a plain one, one branched `group_size` times, or one with vines (not against an API
        model, whose every move of every vine would be a paid request); its records, the whole game's first."""
        options = {"max_turns": self.cfg.max_turns, "learner_player_ids": learner_ids}
        if is_eval:
            return [play_episode(spec, agents, seed, is_eval=True, **options)]
        if self.cfg.group_size > 1:
            return play_branched_episode(spec, agents, seed, self.cfg.group_size, **options)
        if self.cfg.vines.enabled and not any(o.api_model for o in opponents):
            return play_vined_episode(spec, agents, seed, self.cfg.vines, **options)
        return [play_episode(spec, agents, seed, **options)]


def _failure(game: Future) -> str | None:
    """Why a finished game's future failed (its worker raised, or its record says so: the first line), or None."""
    if game.exception() is not None:
        log.error("game worker crashed: %r", game.exception())
        return repr(game.exception())
    record = game.result()
    return record.error.splitlines()[0] if record.failed else None


def _write_for_test(records: list[GameRecord]) -> None:
    """The test hook of `RECORDS_ENV` (nothing when it is unset)."""
    directory = os.environ.get(RECORDS_ENV)
    if directory:
        with _RECORDS_FILE:
            append_games(directory, records)
