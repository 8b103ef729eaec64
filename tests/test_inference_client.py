"""Routing requests over several inference servers (by game, within a load bound); the server's pass-through for
self-batching backends."""

import pickle
import random
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.config import ConfigError, validate_config
from unstable.games.moves import legal_moves
from unstable.inference import InferenceClient, InferenceConfig, InferenceServer
from unstable.pool import ModelPool
from unstable.pool.config import PoolConfig
from unstable.records import Checkpoint, EnvSpec, GenerationRequest, GenerationResult
from unstable.tracking import Tracker, keys

RESULT = GenerationResult("x", (1, 2), (3, 4, 5), (-0.1, -0.2, -0.3))


class _FakeServer:
    def __init__(self, name, gate=None):
        self.name, self.gate, self.seen = name, gate, []

    def generate(self, request):
        self.seen.append(request.prompt)
        if self.gate is not None:
            self.gate.wait(timeout=10)
        return RESULT

    def stats(self, reset=True):
        return {
            "inference/requests": len(self.seen),
            "inference/batches": 1,
            "inference/generated_tokens": 3 * len(self.seen),
            "inference/tokens_per_s": 10.0,
            "inference/mean_batch_size": float(len(self.seen)),
            "inference/busy_fraction": 0.5 if self.name == "a" else 1.0,
            "inference/prompt_tokens": 2 * len(self.seen),
            "inference/cached_prompt_tokens": len(self.seen) if self.name == "a" else 0,
            "inference/prefix_cache_hit_rate": 0.5 if self.name == "a" else 0.0,
            "inference/policy_version": 3 if self.name == "a" else -1,
            "inference/checkpoints_fetched": 1,
            "inference/checkpoint_bytes_fetched": 10,
        }


def test_sequential_requests_take_turns():
    servers = [_FakeServer("a"), _FakeServer("b")]
    client = InferenceClient(servers)
    for i in range(4):
        client.generate(GenerationRequest(str(i)))
    assert servers[0].seen == ["0", "2"] and servers[1].seen == ["1", "3"]


def test_requests_go_to_the_server_with_fewest_in_flight():
    gate = threading.Event()
    slow, fast = _FakeServer("a", gate), _FakeServer("b")
    client = InferenceClient([slow, fast])
    blocked = threading.Thread(target=client.generate, args=(GenerationRequest("waits"),))
    blocked.start()
    while not slow.seen:
        pass
    for i in range(3):
        client.generate(GenerationRequest(str(i)))  # the slow server is busy: all go to the other one
    gate.set()
    blocked.join()
    assert slow.seen == ["waits"] and fast.seen == ["0", "1", "2"]


def _hold(client, game, gate_server, count):
    """Start `count` requests of `game` through `client` on threads; they block until `gate_server`'s gate opens.
    Returns the threads once every one of them is in flight on `gate_server`."""
    before = len(gate_server.seen)
    threads = [
        threading.Thread(target=client.generate, args=(GenerationRequest("held", game=game),)) for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    while len(gate_server.seen) < before + count:
        time.sleep(0.001)
    return threads


def test_a_game_stays_on_the_server_it_first_went_to_within_the_load_bound():
    gate = threading.Event()
    a, b = _FakeServer("a", gate), _FakeServer("b")
    client = InferenceClient([a, b])
    held = _hold(client, game=1, gate_server=a, count=1)  # game 1 starts on a (a tie: a first) and waits there
    a.gate = None
    client.generate(GenerationRequest("g2", game=2))  # a new game goes to the least busy server: b
    for turn in range(3):  # a has 1 in flight, b none: game 2 stays on b ...
        client.generate(GenerationRequest(f"g2-{turn}", game=2))
    a.gate = gate
    more = _hold(client, game=1, gate_server=a, count=1)  # ... and game 1 stays on a although a is busier
    gate.set()
    for thread in held + more:
        thread.join(timeout=10)
    assert a.seen == ["held", "held"] and b.seen == ["g2", "g2-0", "g2-1", "g2-2"]


def test_a_game_moves_to_the_least_busy_server_when_its_own_has_too_many_in_flight():
    gate_a, gate_b = threading.Event(), threading.Event()
    a, b = _FakeServer("a", gate_a), _FakeServer("b", gate_b)
    client = InferenceClient([a, b])
    held = _hold(client, game=1, gate_server=a, count=1)  # game 1 lives on a
    on_b = _hold(client, game=2, gate_server=b, count=1)  # game 2 goes to b: 1 in flight on each
    held += _hold(client, game=1, gate_server=a, count=2)  # a: 1, then 2 in flight <= 2 x 1 + 2: game 1 stays
    gate_b.set()
    on_b[0].join(timeout=10)  # now a has 3 in flight and b none
    client.generate(GenerationRequest("moved", game=1))  # 3 > 2 x 0 + 2: game 1 moves to b ...
    client.generate(GenerationRequest("stays", game=1))  # ... and stays there
    gate_a.set()
    for thread in held:
        thread.join(timeout=10)
    assert a.seen == ["held"] * 3 and b.seen == ["held", "moved", "stays"]


def test_a_finished_game_is_forgotten_so_the_client_holds_only_games_in_flight():
    a, b = _FakeServer("a"), _FakeServer("b")
    client = InferenceClient([a, b])
    for game in range(1000):  # a long run: many games, each forgotten when it ends
        client.generate(GenerationRequest("first", game=game))
        client.generate(GenerationRequest("second", game=game))
        client.end_game(game)
    assert len(client._games) == 0
    client.end_game(5)  # a game never seen (or ended twice) is fine
    assert len(a.seen) == len(b.seen) == 1000


def test_routing_least_outstanding_ignores_games():
    client = pickle.loads(pickle.dumps(InferenceClient([_FakeServer("a"), _FakeServer("b")], by_game=False)))
    a, b = client.servers  # the copies: the setting survived pickling
    for turn in range(4):
        client.generate(GenerationRequest(str(turn), game=1))
    assert a.seen == ["0", "2"] and b.seen == ["1", "3"] and len(client._games) == 0
    data = {"model": {"path": "m"}, "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]}}
    assert validate_config(data).inference.routing == "game"
    with pytest.raises(ConfigError, match="inference.routing = 'seat'"):
        validate_config(data | {"inference": {"routing": "seat"}})


class _LegalMoveServer(_FakeServer):
    """Answers each TicTacToe request with a legal move; records which game each request named and how many
    games the client held at that moment."""

    def __init__(self, name, games_held):
        super().__init__(name)
        self.games, self.games_held, self.rng = [], games_held, random.Random(name)

    def generate(self, request):
        self.games.append(request.game)
        self.games_held.append(len(self.client._games))
        return GenerationResult(f"\\boxed{{{self.rng.choice(legal_moves(request.prompt))}}}", (1,), (2,), (-0.1,))


def test_the_collector_keeps_each_game_on_one_server_and_the_client_forgets_it_when_it_ends(tmp_path):
    games_held = []
    servers = [_LegalMoveServer("a", games_held), _LegalMoveServer("b", games_held)]
    client = InferenceClient(servers)
    for server in servers:
        server.client = client
    pool = ModelPool(PoolConfig(sample_mode="mirror"))
    pool.add_checkpoint(path=None, iteration=-1)
    cfg = CollectorConfig(training_envs=[EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")])
    collector = Collector(client, pool, StepBuffer(BufferConfig(max_buffer_size=4096)), Tracker(tmp_path), cfg)
    with ThreadPoolExecutor(4) as games:
        records = list(games.map(lambda _: collector.play_one(is_eval=False), range(40)))
    assert not any(r.failed for r in records)
    on_a, on_b = set(servers[0].games), set(servers[1].games)
    assert on_a and on_b and not on_a & on_b  # both served games, and every game stayed on one of them
    assert on_a | on_b == {r.seed for r in records}  # every request named its game: both seats, every turn
    assert max(games_held) <= 4 and len(client._games) == 0  # held while in flight, forgotten at the end


def test_stats_merge_over_servers_and_the_client_pickles():
    servers = [_FakeServer("a"), _FakeServer("b")]
    client = pickle.loads(pickle.dumps(InferenceClient(servers)))
    for i in range(3):
        client.generate(GenerationRequest(str(i)))
    stats = client.metrics()
    assert stats["inference/requests"] == 3 and stats["inference/generated_tokens"] == 9
    assert stats["inference/tokens_per_s"] == 20.0 and stats["inference/mean_batch_size"] == 1.5
    assert stats["inference/busy_fraction"] == 0.75
    assert stats["inference/requests_by_actor"] == [2, 1] and stats["inference/policy_version_by_actor"] == [3, -1]
    assert stats["inference/prompt_tokens"] == 6 and stats["inference/cached_prompt_tokens"] == 2
    assert stats["inference/prefix_cache_hit_rate"] == pytest.approx(2 / 6)  # over both servers' prompt tokens
    assert stats["inference/checkpoints_fetched"] == 2 and stats["inference/checkpoint_bytes_fetched"] == 20


class _Gone(Exception):
    """What a proxy raises when the server's actor died or restarts (Ray's RayActorError)."""


class _GoneServer(_FakeServer):
    """A server whose actor is gone until `back` is set."""

    def __init__(self, name):
        super().__init__(name)
        self.back, self.refused = False, 0

    def generate(self, request):
        if not self.back:
            self.refused += 1
            raise _Gone(f"server {self.name} is restarting")
        return super().generate(request)


def test_a_request_to_a_server_whose_actor_is_gone_goes_to_another_and_the_server_rests(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("unstable.inference.client.time.monotonic", lambda: clock[0])
    gone, b = _GoneServer("a"), _FakeServer("b")
    client = InferenceClient([gone, b], unavailable=lambda exc: isinstance(exc, _Gone))
    assert client.generate(GenerationRequest("0", game=1)) == RESULT  # a refused it: answered by b, game 1 moved
    for i in range(3):  # while a rests, new games and game 1 go to b, although a has none in flight
        client.generate(GenerationRequest(f"new-{i}", game=10 + i))
        client.generate(GenerationRequest(f"g1-{i}", game=1))
    assert gone.refused == 1 and len(b.seen) == 7
    clock[0] += 10.0  # past its rest: one of the next two new games (ties take turns) tries a, still gone
    for game in (20, 21):
        assert client.generate(GenerationRequest("probe", game=game)) == RESULT  # b answers both
    gone.back, clock[0] = True, clock[0] + 10.0  # restarted: it takes one of the next two new games again
    for game in (30, 31):
        client.generate(GenerationRequest("back", game=game))
    assert gone.refused == 2 and gone.seen == ["back"] and b.seen[-3:] == ["probe", "probe", "back"]
    faulty_first = InferenceClient([_FaultyServer("c"), _FakeServer("d")], unavailable=lambda e: isinstance(e, _Gone))
    with pytest.raises(RuntimeError, match="not about the actor"):  # any other error is the request's own
        faulty_first.generate(GenerationRequest("x"))
    assert faulty_first.servers[1].seen == []


class _FaultyServer(_FakeServer):
    def generate(self, request):
        raise RuntimeError("a fault not about the actor")


def test_a_server_that_cannot_answer_counts_as_idle_in_the_row_and_the_others_still_report():
    class DeadServer(_FakeServer):
        def stats(self, reset=True):
            raise RuntimeError("the actor died unexpectedly")  # as Ray raises while an actor restarts

    client = InferenceClient([_FakeServer("a"), DeadServer("b")])
    client.generate(GenerationRequest("0"))
    stats = client.metrics()
    assert stats["inference/requests_by_actor"] == [1, 0] and stats["inference/policy_version_by_actor"] == [3, -1]


def test_num_actors_must_be_positive():
    data = {"model": {"path": "m"}, "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]}}
    assert validate_config(data).inference.num_actors == 1
    with pytest.raises(ConfigError, match="inference.num_actors = 0"):
        validate_config(data | {"inference": {"num_actors": 0}})


class _SelfBatchingBackend:
    """A backend with `submit`: the server must hand requests over instead of batching them."""

    def submit(self, request):
        future = Future()
        future.set_result(RESULT)
        return future


def test_server_passes_requests_to_a_self_batching_backend_and_counts_them():
    server = InferenceServer(_SelfBatchingBackend)
    server.start()
    assert server._worker is None  # no batching thread
    assert [server.generate(GenerationRequest(str(i))) for i in range(3)] == [RESULT] * 3
    stats = server.stats()
    assert stats["inference/requests"] == 3 and stats["inference/generated_tokens"] == 9


class _HeldBackend:
    """A self-batching backend whose requests finish when the test says; it records each full-weight load and
    which requests were still running at that moment."""

    def __init__(self):
        self.running: list[Future] = []
        self.loads: list[tuple[str, int]] = []  # (path, requests running during the load)

    def submit(self, request):
        future = Future()
        self.running.append(future)
        return future

    def load_weights(self, path):
        if path == "broken":
            raise RuntimeError("no weights in 'broken'")
        self.loads.append((path, sum(not f.done() for f in self.running)))

    def finish_all(self):
        for future in self.running:
            if not future.done():
                future.set_result(RESULT)


BASE = Checkpoint("ckpt--1", None, -1)
FULL_1 = Checkpoint("ckpt-1", "ckpt-1-dir", 1, kind="full")


def test_a_newer_full_checkpoint_is_loaded_once_running_requests_finish_and_results_name_their_weights():
    backend = _HeldBackend()
    server = InferenceServer(lambda: backend)
    server.start()
    old = server.submit(GenerationRequest("a", BASE))  # a game that started before the update
    served = []
    newer = threading.Thread(target=lambda: served.append(server.generate(GenerationRequest("b", FULL_1))))
    newer.start()
    newer.join(timeout=0.5)
    assert newer.is_alive() and backend.loads == []  # the reload waits: `old` still runs on the old weights
    backend.finish_all()
    assert old.result(timeout=10).served_by == BASE
    while newer.is_alive():
        backend.finish_all()
        newer.join(timeout=0.05)
    assert backend.loads == [("ckpt-1-dir", 0)]  # loaded before the request naming it ran, with nothing running
    assert served[0].served_by == FULL_1

    stale = server.submit(GenerationRequest("c", BASE))  # an older game's request runs on the newer weights
    backend.finish_all()
    assert stale.result(timeout=10).served_by == FULL_1 and len(backend.loads) == 1


def test_a_failed_full_weight_load_fails_the_request_naming_it_and_is_retried():
    backend = _HeldBackend()
    server = InferenceServer(lambda: backend)
    server.start()
    broken = Checkpoint("ckpt-2", "broken", 2, kind="full")
    with pytest.raises(RuntimeError, match="no weights in 'broken'"):
        server.submit(GenerationRequest("a", broken)).result(timeout=10)
    request = server.submit(GenerationRequest("b", FULL_1))  # the server still serves, and loads what it can
    backend.finish_all()
    assert request.result(timeout=10).served_by == FULL_1 and backend.loads == [("ckpt-1-dir", 0)]


def test_the_server_reports_the_newest_policy_it_served():
    class FullWeightsBackend(_SelfBatchingBackend):
        def load_weights(self, path):
            pass

    server = InferenceServer(FullWeightsBackend)
    server.start()
    assert server.stats()[keys.INFERENCE_POLICY_VERSION] == -1  # nothing served yet: the initial policy's version
    server.generate(GenerationRequest("a", FULL_1))
    server.generate(GenerationRequest("b", BASE))  # an older game's request: served by ckpt-1's weights
    assert server.stats()[keys.INFERENCE_POLICY_VERSION] == 1
    assert server.stats()[keys.INFERENCE_POLICY_VERSION] == 1  # not a count: it outlives the reset


def test_the_server_counts_the_prompt_tokens_its_prefix_cache_served(tiny_model_dir):
    from unstable.inference.base import SamplingConfig
    from unstable.inference.transformers_backend import TransformersBackend

    server = InferenceServer(lambda: TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=2)))
    server.start()
    try:
        prompt = "Current Board: 0 | 1 | 2 ---+---+--- 3 | 4 | 5 ---+---+--- 6 | 7 | 8. Your move, please. " * 3
        first = server.generate(GenerationRequest(prompt))
        second = server.generate(GenerationRequest(prompt))
    finally:
        server.stop()
    length = len(first.prompt_token_ids)
    assert first.cached_prompt_tokens == 0 and second.cached_prompt_tokens == (length - 1) // 16 * 16 > 0
    stats = server.stats()
    assert stats[keys.INFERENCE_PROMPT_TOKENS] == 2 * length
    assert stats[keys.INFERENCE_CACHED_PROMPT_TOKENS] == second.cached_prompt_tokens
    assert stats[keys.INFERENCE_PREFIX_CACHE_HIT_RATE] == pytest.approx(second.cached_prompt_tokens / (2 * length))


def test_a_stale_games_decision_records_the_weights_that_served_it():
    from unstable.agents.policy import PolicyAgent
    from unstable.games import get_template

    class FullWeightsBackend(_SelfBatchingBackend):
        def load_weights(self, path):
            pass

    server = InferenceServer(FullWeightsBackend)
    server.start()
    server.generate(GenerationRequest("a", FULL_1))  # the newest game loads ckpt-1
    decision = PolicyAgent(server, BASE, get_template("qwen3-zs")).act("Current Board: 0 | 1 | 2")
    assert decision.checkpoint == FULL_1  # so its Step's policy_version (and staleness) is ckpt-1's


class _GenerateOnlyBackend:
    """A backend with only `generate`: the server batches its requests with its own thread."""

    def generate(self, requests):
        return [RESULT for _ in requests]


class _ClockPastEachDeadline:
    """`time` for the server module whose clock runs 3 ms a reading: 5 ms after a first request, one reading still
    finds time left to wait for company and the next one finds none."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 0.003
        return self.now


def test_the_batching_thread_survives_a_wait_for_company_whose_time_runs_out_between_two_clock_readings(
    monkeypatch,
):
    monkeypatch.setattr("unstable.inference.server.time", _ClockPastEachDeadline())
    server = InferenceServer(_GenerateOnlyBackend)  # waits batch_wait_ms (5 ms) for company after a first request
    server.start()
    try:
        assert server.submit(GenerationRequest("a")).result(timeout=10) == RESULT
        assert server.submit(GenerationRequest("b")).result(timeout=10) == RESULT
    finally:
        server.stop()


class _FaultyBatch:
    """A continuously batching backend whose rows finish after one decode step, with faults named by the prompt:
    'add' joins its rows to the batch and then raises (as a failed sampling after the prefill can), 'step' raises
    in the decode step, 'step+clear' also in the clear after it; a full checkpoint at 'broken' fails to load and
    an adapter at 'broken' too."""

    def __init__(self):
        self.rows: list[tuple[int, GenerationRequest]] = []

    def __len__(self):
        return len(self.rows)

    def adapters_in_use(self):
        return {r.checkpoint.uid for _, r in self.rows if r.checkpoint is not None and r.checkpoint.is_adapter}

    def add(self, items):
        self.rows += items
        if any(request.prompt == "add" for _, request in items):
            raise RuntimeError("sampling after the prefill failed")
        return []

    def step(self):
        if any(request.prompt.startswith("step") for _, request in self.rows):
            raise RuntimeError("decode step failed")
        finished, self.rows = self.rows, []
        return [(tag, RESULT) for tag, _ in finished]

    def clear(self):
        if any(request.prompt == "step+clear" for _, request in self.rows):
            raise RuntimeError("the batch cannot be cleared")
        self.rows = []

    def generate(self, requests):
        raise AssertionError("the server steps the continuous batch")

    def load_weights(self, path):
        if path == "broken":
            raise RuntimeError("no weights in 'broken'")

    def load_adapter(self, checkpoint):
        if checkpoint.path == "broken":
            raise RuntimeError("no adapter in 'broken'")

    def unload_adapter(self, uid):
        pass


BROKEN_FULL = Checkpoint("ckpt-3", "broken", 3, kind="full")
BROKEN_ADAPTER = Checkpoint("ckpt-4", "broken", 4)


@pytest.mark.parametrize(
    "faulty",
    [
        GenerationRequest("add"),
        GenerationRequest("step"),
        GenerationRequest("a", BROKEN_FULL),
        GenerationRequest("a", BROKEN_ADAPTER),
    ],
    ids=["add", "step", "full-weight-load", "adapter-load"],
)
def test_a_fault_in_the_batching_thread_fails_only_its_requests_and_the_server_goes_on(faulty):
    server = InferenceServer(_FaultyBatch, InferenceConfig(batch_wait_ms=0))
    server.start()
    try:
        with pytest.raises(RuntimeError, match="failed|no weights|no adapter"):
            server.submit(faulty).result(timeout=10)
        for prompt in "bc":  # later requests are served: the thread lives
            assert server.submit(GenerationRequest(prompt)).result(timeout=10) == RESULT
    finally:
        server.stop()


def test_a_request_its_caller_cancelled_does_not_stop_the_batching_thread():
    gate = threading.Event()

    class HeldBatch(_FaultyBatch):
        def step(self):
            gate.wait(timeout=10)
            return super().step()

    server = InferenceServer(HeldBatch, InferenceConfig(batch_wait_ms=0))
    server.start()
    try:
        running = server.submit(GenerationRequest("a"))
        queued = server.submit(GenerationRequest("b"))
        queued.cancel()  # the caller gave up on it
        gate.set()
        assert running.result(timeout=10) == RESULT
        assert server.submit(GenerationRequest("c")).result(timeout=10) == RESULT
    finally:
        server.stop()


def test_when_the_batching_thread_dies_every_pending_and_later_request_fails_with_the_cause():
    server = InferenceServer(_FaultyBatch, InferenceConfig(batch_wait_ms=0))
    server.start()
    dying = server.submit(GenerationRequest("step+clear"))
    with pytest.raises(RuntimeError, match="decode step failed"):
        dying.result(timeout=10)
    server._worker.join(timeout=10)
    with pytest.raises(RuntimeError, match="batching thread died: RuntimeError\\('the batch cannot be cleared'\\)"):
        server.submit(GenerationRequest("b")).result(timeout=10)


def _submit_until_refused(server, futures: list, errors: list) -> None:
    """Submit requests to `server` until it refuses one; keeps the futures and the refusal's message."""
    while True:
        try:
            futures.append(server.submit(GenerationRequest("a")))
        except RuntimeError as exc:
            errors.append(str(exc))
            return


@pytest.fixture
def frequent_thread_switches():
    """Threads switch every microsecond, so a racing call is often caught between two of its statements."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.slow
def test_every_request_submitted_while_the_server_stops_resolves(frequent_thread_switches):
    for _ in range(20):  # the race is between a submit's check and its enqueue: run it many times
        server = InferenceServer(_GenerateOnlyBackend, InferenceConfig(batch_wait_ms=0))
        server.start()
        futures, errors = [], []
        threads = [
            threading.Thread(target=_submit_until_refused, args=(server, futures, errors), daemon=True)
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.01)
        server.stop()
        for thread in threads:
            thread.join(timeout=10)
        for future in futures:
            try:
                assert future.result(timeout=5) == RESULT
            except RuntimeError as exc:
                assert "inference server stopped" in str(exc)
        assert set(errors) == {"inference server stopped"}
