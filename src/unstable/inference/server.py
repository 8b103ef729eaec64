"""A continuously batching front for any backend: a request joins the running batch at the next decode step.

Game threads call `generate` concurrently and block on a future; one worker thread admits queued requests into
the backend's running batch between decode steps (in arrival order, while there is room, their adapters fit in
`max_loras` beside the running rows' and no newer full-weight checkpoint waits for the batch to drain), makes
their adapters resident (loading from the checkpoint path, evicting the least recently used one no running row
needs), steps the batch and resolves each future the moment its row finishes, so a finished row's slot goes to
a waiting request at once. A backend with only `generate` runs as static batches (`StaticBatches`): an idle
server waits up to `batch_wait_ms` for company, then completes the whole batch in one step. A backend with its
own `submit` (vLLM's engine, which also manages its adapters) gets each request straight away; the server counts
them and keeps the rule below. The Ray actor is this class under `ray.remote(max_concurrency=...)`: the same code
serves local runs and tests.

Full fine-tuning, on either path: a request naming a full checkpoint newer than the loaded weights waits until
no request runs (new arrivals wait too), then the backend loads it and it runs; so no row changes weights
mid-completion. A request naming an older checkpoint (its game started before the update) runs on the loaded
weights, and every result's `served_by` names the checkpoint that actually produced it.

No request waits forever: a fault in the batching thread fails the requests it touched and the thread goes on; if
the thread dies anyway, or the server stops, every pending and later request fails saying so.

A server on another node than the checkpoints' is given a `CheckpointCache`: every checkpoint reaches the backend
by its path in that cache (fetched on the calling thread when a request arrives, so the batching thread seldom
waits for it); `served_by` still names the checkpoint as the request named it.

Weights handed over in memory (`offer`: the learner's tensors of a new checkpoint, before its folder is written) are
kept for the newest `max_loras + 1` checkpoints and loaded from memory when a request names one; any other
checkpoint loads from its folder.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

from unstable.inference.base import InferenceBackend
from unstable.inference.checkpoints import CheckpointCache
from unstable.inference.config import InferenceConfig
from unstable.records import Checkpoint, GenerationRequest, GenerationResult
from unstable.tracking import keys

log = logging.getLogger(__name__)

# test hook: when set, every full-weight load fails (as vLLM's reload did under full fine-tuning), so a test of a
# whole run can make every learner game after the first update fail
FAIL_LOADS_ENV = "UNSTABLE_TEST_FAIL_WEIGHT_LOADS"


class InferenceServer:
    """Micro-batches concurrent generation requests onto one backend and hot-swaps LoRA checkpoints; with
    `checkpoints`, loads every checkpoint from that node-local cache (this node cannot see their paths)."""

    def __init__(
        self,
        backend_factory: Callable[[], InferenceBackend],
        cfg: InferenceConfig | None = None,
        checkpoints: CheckpointCache | None = None,
    ):
        cfg = cfg or InferenceConfig()
        self._backend_factory = backend_factory
        self._checkpoints = checkpoints
        self.max_batch_size = cfg.max_batch_size
        self.batch_wait_s = cfg.batch_wait_ms / 1000.0
        self.max_loras = cfg.max_loras
        self._queue: queue.Queue[tuple[GenerationRequest, Future]] = queue.Queue()
        self._resident: OrderedDict[str, Checkpoint] = OrderedDict()
        self._offered: OrderedDict[str, tuple] = OrderedDict()  # uid -> (PEFT config or None, tensors), newest last
        self._offered_lock = threading.Lock()
        self._full_weights: Checkpoint | None = None  # the full checkpoint loaded (None: the model's own weights)
        self._in_flight = 0  # requests handed to a self-batching backend and not finished
        self._reloading = False  # a newer full checkpoint waits for them to finish
        self._in_flight_changed = threading.Condition()
        self._tags = itertools.count()
        self._waiting: deque[tuple[int, tuple[GenerationRequest, Future]]] = deque()
        self._active: dict[int, tuple[GenerationRequest, Future]] = {}
        self._waiting_since = 0.0  # when the oldest waiting request arrived
        self._expect_company = True  # whether an idle server should wait for more requests than the first
        self._counters = _Counters()
        self._backend: InferenceBackend | None = None
        self._engine = None  # the backend's continuous batch, or StaticBatches over its `generate`
        self._worker: threading.Thread | None = None
        self._stopped = threading.Event()
        self._closed: str | None = None  # why the batching thread takes no more requests (None: it takes them)
        self._accepting = threading.Lock()  # a submit's check and enqueue happen wholly before or after closing

    def start(self) -> None:
        """Build the backend (loads the model); start the batching thread unless it batches itself. Idempotent."""
        if self._backend is not None:
            return
        self._backend = self._backend_factory()
        self._engine = self._backend if hasattr(self._backend, "step") else StaticBatches(self._backend)
        if not hasattr(self._backend, "submit"):
            self._worker = threading.Thread(target=self._serve, name="inference-batcher", daemon=True)
            self._worker.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the batching thread and wait up to `timeout_s` for it to finish the batch it is running;
        pending requests, and any submitted from now on, fail with RuntimeError."""
        self._stopped.set()
        self._queue.put((None, None))  # type: ignore[arg-type]  # wakes the worker
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)
        if self._checkpoints is not None:
            self._checkpoints.close()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request (blocking until its batch ran)."""
        return self.submit(request).result()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue one request (or hand it to a self-batching backend) and return a future for its result. Raises
        RuntimeError once the server stopped or its batching thread died (saying so, with the cause)."""
        if self._backend is None:
            raise RuntimeError("InferenceServer.start() was not called")
        self._on_disk(request.checkpoint)  # fetched here, on the caller's thread, not on the batching thread
        with self._accepting:
            if self._stopped.is_set():
                raise RuntimeError(self._closed or "inference server stopped")
            if self._worker is not None:
                future: Future = Future()
                self._queue.put((request, future))
                return future
        return self._submit_direct(request)

    def offer(self, checkpoint: Checkpoint, served: tuple) -> bool:
        """Keep `served` (a LoRA adapter's PEFT config and tensors, or None and full weights) for `checkpoint`, to load
        from memory when a request names it; returns whether the backend loads weights from memory (else it will read
        the checkpoint's folder)."""
        if not (isinstance(self._backend, InferenceBackend) and self._backend.takes_tensors(checkpoint)):
            return False
        with self._offered_lock:
            self._offered[checkpoint.uid] = served
            while len(self._offered) > self.max_loras + 1:
                self._offered.popitem(last=False)
        return True

    def end_game(self, game: int) -> None:
        """Nothing to forget: one server serves every game (an `InferenceClient` over several routes by game)."""

    def stats(self, reset: bool = True) -> dict[str, float]:
        """Throughput counters since the last reset: requests, batches, generated tokens, tokens/s, prompt tokens
        and those the prefix cache gave; and the newest checkpoint version served so far (-1: the initial policy's,
        or none yet).

        With a self-batching backend every request counts as one batch and `busy_fraction` is the mean
        number of requests in flight. Checkpoints fetched from another node (and their bytes) count too.
        """
        if self._checkpoints is None:
            return self._counters.snapshot(reset) | dict.fromkeys(_FETCHED, 0)
        return self._counters.snapshot(reset) | self._checkpoints.stats(reset)

    def _on_disk(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """`checkpoint` as this node reads it: from the checkpoint cache when there is one (not for weights offered in
        memory, whose folder may not be written yet)."""
        if self._checkpoints is None or checkpoint is None or self._in_memory(checkpoint) is not None:
            return checkpoint
        return self._checkpoints.local(checkpoint)

    def _in_memory(self, checkpoint: Checkpoint) -> tuple | None:
        """The weights offered for `checkpoint`, None when none were (or they were let go)."""
        with self._offered_lock:
            return self._offered.get(checkpoint.uid)

    def _submit_direct(self, request: GenerationRequest) -> Future:
        """Hand one request to the self-batching backend, on the weights `_enter` chose; the returned future
        resolves to its result, counted and stamped with the checkpoint that served it."""
        start = time.perf_counter()
        served_by = self._enter(request.checkpoint)
        future: Future = Future()
        future.set_running_or_notify_cancel()  # handed over at once: no longer cancellable

        def finish(done: Future) -> None:
            self._leave()
            if done.exception() is not None:
                future.set_exception(done.exception())
                return
            result = replace(done.result(), served_by=served_by)
            self._counters.add(1, [result], time.perf_counter() - start)
            future.set_result(result)

        try:
            on_disk = replace(request, checkpoint=self._on_disk(request.checkpoint))
            self._backend.submit(on_disk).add_done_callback(finish)
        except BaseException:
            self._leave()
            raise
        return future

    def _enter(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """Count one request in flight and return the checkpoint whose weights will serve it. A newer full
        checkpoint is loaded first, once every running request has finished; arrivals wait meanwhile. A failed
        load raises here (to the request naming it) and the next request naming it tries again."""
        with self._in_flight_changed:
            self._in_flight_changed.wait_for(lambda: not self._reloading)
            if self._needs_loading(checkpoint):
                self._reloading = True
                try:
                    self._in_flight_changed.wait_for(lambda: self._in_flight == 0)
                    self._load_full_weights(checkpoint)
                finally:
                    self._reloading = False
                    self._in_flight_changed.notify_all()
            self._in_flight += 1
            return self._served_by(checkpoint)

    def _leave(self) -> None:
        with self._in_flight_changed:
            self._in_flight -= 1
            self._in_flight_changed.notify_all()

    def _serve(self) -> None:
        """The batching thread: admit and step until stopped. A fault in a round fails the running batch's
        requests and the thread goes on; one it cannot survive ends it, and every pending and later request
        fails with its cause."""
        reason = "inference server stopped"
        try:
            while not self._stopped.is_set():
                try:
                    self._admit()
                    if len(self._engine):
                        self._step()
                except Exception as exc:  # noqa: BLE001 - the callers see the error through their futures
                    log.exception("batching round over %d running requests failed", len(self._active))
                    self._drop_batch(exc)
        except BaseException as exc:  # noqa: BLE001 - said to every pending and later request, and logged
            reason = f"inference server's batching thread died: {exc!r}"
            log.critical(reason, exc_info=True)
        finally:
            self._close(reason)

    def _admit(self) -> None:
        """Move arrivals to the waiting line, then admit from its front what the batch can take now."""
        idle = not len(self._engine) and not self._waiting
        arrivals = self._arrivals(block=idle)
        if arrivals and not self._waiting:
            self._waiting_since = time.perf_counter()
        self._waiting.extend(arrivals)
        if not self._admission_due():
            return
        admitted = self._admissible()
        if not admitted:
            return
        start = time.perf_counter()
        running = len(self._engine)
        try:
            failed = self._make_resident(
                [r.checkpoint for _, (r, _) in admitted if r.checkpoint and r.checkpoint.is_adapter]
            )
            admitted = self._without_failed_adapters(admitted, failed)
            finished = self._engine.add([(tag, request) for tag, (request, _) in admitted])
        except Exception as exc:  # noqa: BLE001 - the callers see the error through their futures
            log.exception("admitting %d requests failed", len(admitted))
            self._fail(dict(admitted), exc)
            if len(self._engine) != running:  # some joined the batch before the fault: its state is unknown
                self._drop_batch(exc)
            return
        self._active.update(admitted)
        self._expect_company = len(self._active) > 1
        self._finish(finished, rows=0, seconds=time.perf_counter() - start)

    def _admission_due(self) -> bool:
        """Whether to prefill the waiting requests now: the batch is empty, they fill its free rows, or the
        oldest has waited `batch_wait_ms` (one prefill for several requests costs much less than one each)."""
        if not self._waiting:
            return False
        free_rows = self.max_batch_size - len(self._engine)
        waited = time.perf_counter() - self._waiting_since
        return not len(self._engine) or len(self._waiting) >= free_rows or waited >= self.batch_wait_s

    def _arrivals(self, block: bool) -> list[tuple[int, tuple[GenerationRequest, Future]]]:
        """What is queued; when idle, wait for a first request and then up to `batch_wait_ms` for company, unless
        the last batch held a single row (one game at a time: waiting would only add latency)."""
        arrivals = []
        deadline = None
        while len(arrivals) < self.max_batch_size:
            try:
                if block and deadline is None:
                    item = self._queue.get()
                    deadline = time.perf_counter() + (self.batch_wait_s if self._expect_company else 0.0)
                elif block and (left := deadline - time.perf_counter()) > 0:  # one reading: never a negative wait
                    item = self._queue.get(timeout=left)
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] is None:
                self._stopped.set()
                break
            if item[1].set_running_or_notify_cancel():  # else its caller cancelled it: nobody waits for it
                arrivals.append((next(self._tags), item))
        return arrivals

    def _admissible(self) -> list[tuple[int, tuple[GenerationRequest, Future]]]:
        """Admit waiting requests in order while the batch has room, their adapters fit in `max_loras` beside
        the running rows' and no newer full-weight checkpoint must first be loaded (that waits for the batch
        to drain, so no row changes weights mid-completion; a failed load fails the request naming it)."""
        admitted = []
        adapters = self._engine.adapters_in_use()
        while self._waiting and len(self._engine) + len(admitted) < self.max_batch_size:
            request = self._waiting[0][1][0]
            ckpt = request.checkpoint
            if self._needs_loading(ckpt):
                if len(self._engine) or admitted:
                    break
                try:
                    self._load_full_weights(ckpt)
                except Exception as exc:  # noqa: BLE001 - the request naming it sees the error; the next retries
                    log.error("loading full checkpoint %s failed: %r", ckpt.uid, exc)  # one line: it may recur
                    _, (_, future) = self._waiting.popleft()
                    future.set_exception(exc)
                    continue
            if ckpt is not None and ckpt.is_adapter and ckpt.uid not in adapters:
                if len(adapters) >= self.max_loras:
                    break
                adapters.add(ckpt.uid)
            admitted.append(self._waiting.popleft())
        return admitted

    def _step(self) -> None:
        rows = len(self._engine)
        start = time.perf_counter()
        finished = self._engine.step()
        self._finish(finished, rows, time.perf_counter() - start)

    def _drop_batch(self, exc: Exception) -> None:
        """Fail every running request with `exc` and empty the batch (after a fault left it in an unknown state)."""
        failed, self._active = self._active, {}
        self._fail(failed, exc)
        self._engine.clear()

    def _finish(self, finished: list[tuple[int, GenerationResult]], rows: int, seconds: float) -> None:
        results = []
        for tag, result in finished:  # the weights have not changed since these rows were admitted
            request, future = self._active.pop(tag)
            results.append((future, replace(result, served_by=self._served_by(request.checkpoint))))
        self._counters.add(rows, [result for _, result in results], seconds)
        for future, result in results:
            future.set_result(result)

    def _fail(self, items: dict[int, tuple[GenerationRequest, Future]], exc: Exception) -> None:
        for _, future in items.values():
            future.set_exception(exc)

    def _needs_loading(self, checkpoint: Checkpoint | None) -> bool:
        """Whether `checkpoint` is a full checkpoint newer than the weights loaded."""
        loaded = self._full_weights.version if self._full_weights is not None else -1
        return checkpoint is not None and checkpoint.kind == "full" and checkpoint.version > loaded

    def _load_full_weights(self, checkpoint: Checkpoint) -> None:
        """Full fine-tuning: load a newer full checkpoint into the base weights (no request is running)."""
        if os.environ.get(FAIL_LOADS_ENV):
            raise RuntimeError(f"full checkpoint {checkpoint.path} not loaded: {FAIL_LOADS_ENV} is set")
        if (served := self._in_memory(checkpoint)) is not None:
            self._backend.load_weight_tensors(served[1])
        else:
            self._backend.load_weights(self._on_disk(checkpoint).path)
        self._full_weights = checkpoint

    def _served_by(self, checkpoint: Checkpoint | None) -> Checkpoint | None:
        """The checkpoint whose weights serve a request naming `checkpoint` now: an adapter is applied as named;
        anything else runs on the base weights, the newest full checkpoint loaded if there is one."""
        if self._full_weights is None or (checkpoint is not None and checkpoint.is_adapter):
            return checkpoint
        return self._full_weights

    def _make_resident(self, checkpoints: list[Checkpoint]) -> dict[str, Exception]:
        """Load the adapters `checkpoints` name, evicting the least recently used ones no running row needs; returns
        the error of each adapter that failed to load, by uid (logged; the others load regardless)."""
        needed = {c.uid: c for c in checkpoints}
        keep = needed.keys() | self._engine.adapters_in_use()
        failed: dict[str, Exception] = {}
        for uid, checkpoint in needed.items():
            if uid in self._resident:
                self._resident.move_to_end(uid)
                continue
            while len(self._resident) >= self.max_loras:
                victim = next(u for u in self._resident if u not in keep)
                self._backend.unload_adapter(victim)
                del self._resident[victim]
            try:
                if (served := self._in_memory(checkpoint)) is not None:
                    self._backend.load_adapter_tensors(uid, *served)
                else:
                    self._backend.load_adapter(self._on_disk(checkpoint))
            except Exception as exc:  # noqa: BLE001 - the requests naming it see the error
                log.error("loading adapter %s from %s failed: %r", uid, checkpoint.path, exc)
                failed[uid] = exc
                continue
            self._resident[uid] = checkpoint
        return failed

    def _without_failed_adapters(self, admitted: list, failed: dict[str, Exception]) -> list:
        """`admitted` less the requests naming an adapter in `failed`, whose callers get its error."""
        kept = []
        for tag, (request, future) in admitted:
            ckpt = request.checkpoint
            if ckpt is not None and ckpt.is_adapter and ckpt.uid in failed:
                future.set_exception(failed[ckpt.uid])
            else:
                kept.append((tag, (request, future)))
        return kept

    def _close(self, reason: str) -> None:
        """Take no more requests and fail every pending one with RuntimeError(`reason`)."""
        with self._accepting:  # no submit enqueues after this
            self._closed = reason
            self._stopped.set()
        error = RuntimeError(reason)
        self._fail(self._active, error)
        self._fail(dict(self._waiting), error)
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(error)


class StaticBatches:
    """The step protocol over a backend that only has `generate`: each step completes every admitted row."""

    def __init__(self, backend: InferenceBackend):
        self.backend = backend
        self.pending: list[tuple[int, GenerationRequest]] = []

    def __len__(self) -> int:
        return len(self.pending)

    def adapters_in_use(self) -> set[str]:
        """The adapters of the admitted rows."""
        return {r.checkpoint.uid for _, r in self.pending if r.checkpoint is not None and r.checkpoint.is_adapter}

    def add(self, items: list[tuple[int, GenerationRequest]]) -> list[tuple[int, GenerationResult]]:
        """Admit rows; none finishes before the next step."""
        self.pending += items
        return []

    def step(self) -> list[tuple[int, GenerationResult]]:
        """Generate every admitted row in one batch."""
        items, self.pending = self.pending, []
        return list(zip([tag for tag, _ in items], self.backend.generate([request for _, request in items])))

    def clear(self) -> None:
        """Forget the admitted rows."""
        self.pending = []


def merge_stats(per_server: list[dict[str, float]]) -> dict[str, float]:
    """One `stats()` row for several servers: counts and tokens/s add up, rows per forward pass is the mean over
    every server's forward passes, busy fraction the mean over servers, the prefix cache hit rate the share over
    every server's prompt tokens; each server's own tokens/s, requests and newest checkpoint served are kept, in
    server order, under `inference/tokens_per_s_by_actor`, `inference/requests_by_actor` and
    `inference/policy_version_by_actor`."""
    merged = {key: sum(stats[key] for stats in per_server) for key in _SUMMED}
    for key, by_actor in _BY_ACTOR.items():
        merged[by_actor] = [stats[key] for stats in per_server]
    rows = sum(s[keys.INFERENCE_MEAN_BATCH_SIZE] * s[keys.INFERENCE_BATCHES] for s in per_server)
    merged[keys.INFERENCE_MEAN_BATCH_SIZE] = rows / max(merged[keys.INFERENCE_BATCHES], 1)
    merged[keys.INFERENCE_BUSY_FRACTION] = sum(s[keys.INFERENCE_BUSY_FRACTION] for s in per_server) / len(per_server)
    merged[keys.INFERENCE_PREFIX_CACHE_HIT_RATE] = _hit_rate(
        merged[keys.INFERENCE_CACHED_PROMPT_TOKENS], merged[keys.INFERENCE_PROMPT_TOKENS]
    )
    return merged


def idle_stats() -> dict[str, float]:
    """The `stats()` of a server that served nothing, holds no checkpoint and fetched none (a fresh one)."""
    return _Counters().snapshot(reset=False) | dict.fromkeys(_FETCHED, 0)


def _hit_rate(cached_tokens: int, prompt_tokens: int) -> float:
    """The share of prompt tokens that came from a prefix cache (0 with none)."""
    return cached_tokens / max(prompt_tokens, 1)


_FETCHED = (keys.INFERENCE_CHECKPOINTS_FETCHED, keys.INFERENCE_CHECKPOINT_BYTES)
_SUMMED = (
    keys.INFERENCE_REQUESTS,
    keys.INFERENCE_BATCHES,
    keys.INFERENCE_GENERATED_TOKENS,
    keys.INFERENCE_TOKENS_PER_S,
    keys.INFERENCE_PROMPT_TOKENS,
    keys.INFERENCE_CACHED_PROMPT_TOKENS,
    *_FETCHED,
)
_BY_ACTOR = {
    keys.INFERENCE_TOKENS_PER_S: keys.INFERENCE_TOKENS_PER_S_BY_ACTOR,
    keys.INFERENCE_REQUESTS: keys.INFERENCE_REQUESTS_BY_ACTOR,
    keys.INFERENCE_POLICY_VERSION: keys.INFERENCE_POLICY_VERSION_BY_ACTOR,
}


class _Counters:
    """Thread-safe throughput counters; a batch is one forward pass (a decode step) over the running rows. The
    newest checkpoint version served is kept across resets."""

    def __init__(self):
        self._lock = threading.Lock()
        self.newest_version = -1  # the initial policy's version (the pool's iteration -1)
        self._reset()

    def _reset(self) -> None:
        self.requests = 0
        self.batches = 0
        self.batch_rows = 0
        self.tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.busy_s = 0.0
        self.since = time.perf_counter()

    def add(self, rows: int, finished: list[GenerationResult], seconds: float) -> None:
        """Count one forward pass over `rows` rows (0: an admission) that finished `finished` (their `served_by`
        set)."""
        with self._lock:
            self.requests += len(finished)
            self.batches += rows > 0
            self.batch_rows += rows
            self.tokens += sum(len(r.completion_token_ids) for r in finished)
            self.prompt_tokens += sum(len(r.prompt_token_ids) for r in finished)
            self.cached_tokens += sum(r.cached_prompt_tokens for r in finished)
            versions = [r.served_by.version for r in finished if r.served_by is not None]
            self.newest_version = max([self.newest_version, *versions])
            self.busy_s += seconds

    def snapshot(self, reset: bool) -> dict[str, float]:
        with self._lock:
            elapsed = max(time.perf_counter() - self.since, 1e-9)
            stats = {
                keys.INFERENCE_REQUESTS: self.requests,
                keys.INFERENCE_BATCHES: self.batches,
                keys.INFERENCE_GENERATED_TOKENS: self.tokens,
                keys.INFERENCE_TOKENS_PER_S: self.tokens / elapsed,
                keys.INFERENCE_MEAN_BATCH_SIZE: self.batch_rows / max(self.batches, 1),
                keys.INFERENCE_BUSY_FRACTION: self.busy_s / elapsed,
                keys.INFERENCE_PROMPT_TOKENS: self.prompt_tokens,
                keys.INFERENCE_CACHED_PROMPT_TOKENS: self.cached_tokens,
                keys.INFERENCE_PREFIX_CACHE_HIT_RATE: _hit_rate(self.cached_tokens, self.prompt_tokens),
                keys.INFERENCE_POLICY_VERSION: self.newest_version,
            }
            if reset:
                self._reset()
            return stats
