"""A batching front for any backend: requests arriving within a few milliseconds share one forward pass.

Game threads call `generate` concurrently and block on a future; one worker thread drains the queue, makes
sure each batch's adapters are resident (loading from the checkpoint path, evicting the least recently used
beyond `max_loras`), runs the backend and resolves the futures. A backend with its own `submit` (vLLM's
continuously batching engine, which also manages its adapters) gets each request straight away instead; the
server only counts. The Ray actor is this class under `ray.remote(max_concurrency=...)`: the same code serves
local runs and tests.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

from unstable.inference.base import InferenceBackend
from unstable.inference.config import InferenceConfig
from unstable.records import Checkpoint, GenerationRequest, GenerationResult
from unstable.tracking import keys

log = logging.getLogger(__name__)


class InferenceServer:
    """Micro-batches concurrent generation requests onto one backend and hot-swaps LoRA checkpoints."""

    def __init__(self, backend_factory: Callable[[], InferenceBackend], cfg: InferenceConfig | None = None):
        cfg = cfg or InferenceConfig()
        self._backend_factory = backend_factory
        self.max_batch_size = cfg.max_batch_size
        self.batch_wait_s = cfg.batch_wait_ms / 1000.0
        self.max_loras = cfg.max_loras
        self._queue: queue.Queue[tuple[GenerationRequest, Future]] = queue.Queue()
        self._resident: OrderedDict[str, Checkpoint] = OrderedDict()
        self._full_weights_uid: str | None = None
        self._counters = _Counters()
        self._backend: InferenceBackend | None = None
        self._worker: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Build the backend (loads the model); start the batching thread unless it batches itself. Idempotent."""
        if self._backend is not None:
            return
        self._backend = self._backend_factory()
        if not hasattr(self._backend, "submit"):
            self._worker = threading.Thread(target=self._serve, name="inference-batcher", daemon=True)
            self._worker.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the batching thread and wait up to `timeout_s` for it to finish the batch it is running;
        pending requests fail with RuntimeError."""
        self._stopped.set()
        self._queue.put((None, None))  # type: ignore[arg-type]  # wakes the worker
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request (blocking until its batch ran)."""
        return self.submit(request).result()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue one request (or hand it to a self-batching backend) and return a future for its result."""
        if self._backend is None:
            raise RuntimeError("InferenceServer.start() was not called")
        if self._stopped.is_set():
            raise RuntimeError("inference server stopped")
        if self._worker is None:
            return self._submit_direct(request)
        future: Future = Future()
        self._queue.put((request, future))
        return future

    def stats(self, reset: bool = True) -> dict[str, float]:
        """Throughput counters since the last reset: requests, batches, generated tokens, tokens/s.

        With a self-batching backend every request counts as one batch and `busy_fraction` is the mean
        number of requests in flight.
        """
        return self._counters.snapshot(reset)

    def _submit_direct(self, request: GenerationRequest) -> Future:
        start = time.perf_counter()

        def count(future: Future) -> None:
            if future.exception() is None:
                self._counters.add([future.result()], time.perf_counter() - start)

        future = self._backend.submit(request)
        future.add_done_callback(count)
        return future

    def _serve(self) -> None:
        while not self._stopped.is_set():
            batch = self._next_batch()
            if batch:
                for part in self._split_by_adapters(batch):
                    self._run_batch(part)
        self._fail_pending()

    def _next_batch(self) -> list[tuple[GenerationRequest, Future]]:
        first = self._queue.get()
        if first[0] is None:
            return []
        batch = [first]
        deadline = time.perf_counter() + self.batch_wait_s
        while len(batch) < self.max_batch_size:
            remaining = deadline - time.perf_counter()
            try:
                item = self._queue.get(timeout=max(remaining, 0.0)) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] is None:
                self._stopped.set()
                break
            batch.append(item)
        return batch

    def _split_by_adapters(self, batch: list[tuple[GenerationRequest, Future]]) -> list[list]:
        """Split a batch so no part names more than `max_loras` adapters (base-model rows join the first)."""

        def uid(item):
            ckpt = item[0].checkpoint
            return ckpt.uid if ckpt is not None and ckpt.is_adapter else None

        uids = list(dict.fromkeys(u for u in map(uid, batch) if u is not None))
        if len(uids) <= self.max_loras:
            return [batch]
        groups = [set(uids[i : i + self.max_loras]) for i in range(0, len(uids), self.max_loras)]
        parts = [[item for item in batch if uid(item) in group] for group in groups]
        parts[0] += [item for item in batch if uid(item) is None]
        return parts

    def _run_batch(self, batch: list[tuple[GenerationRequest, Future]]) -> None:
        requests = [request for request, _ in batch]
        start = time.perf_counter()
        try:
            checkpoints = [r.checkpoint for r in requests if r.checkpoint is not None]
            self._sync_full_weights([c for c in checkpoints if c.kind == "full"])
            self._make_resident([c for c in checkpoints if c.is_adapter])
            results = self._backend.generate(requests)
        except Exception as exc:  # noqa: BLE001 - the callers see the error through their futures
            log.exception("inference batch of %d failed", len(batch))
            for _, future in batch:
                future.set_exception(exc)
            return
        self._counters.add(results, time.perf_counter() - start)
        for (_, future), result in zip(batch, results):
            future.set_result(result)

    def _sync_full_weights(self, checkpoints: list[Checkpoint]) -> None:
        """Full fine-tuning: load the newest full checkpoint named by the batch into the base weights once."""
        if not checkpoints:
            return
        newest = max(checkpoints, key=lambda c: c.version)
        if newest.uid != self._full_weights_uid:
            self._backend.load_weights(newest.path)
            self._full_weights_uid = newest.uid

    def _make_resident(self, checkpoints: list[Checkpoint]) -> None:
        needed = {c.uid: c for c in checkpoints}
        if len(needed) > self.max_loras:
            raise RuntimeError(f"one batch needs {len(needed)} adapters but max_loras={self.max_loras}")
        for uid, checkpoint in needed.items():
            if uid in self._resident:
                self._resident.move_to_end(uid)
                continue
            while len(self._resident) >= self.max_loras:
                victim = next(u for u in self._resident if u not in needed)
                self._backend.unload_adapter(victim)
                del self._resident[victim]
            self._backend.load_adapter(checkpoint)
            self._resident[uid] = checkpoint

    def _fail_pending(self) -> None:
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if future is not None:
                future.set_exception(RuntimeError("inference server stopped"))


def merge_stats(per_server: list[dict[str, float]]) -> dict[str, float]:
    """One `stats()` row for several servers: counts and tokens/s add up, busy fraction is the mean; each
    server's own tokens/s is kept, in server order, under `inference/tokens_per_s_by_actor`."""
    merged = {key: sum(stats[key] for stats in per_server) for key in _SUMMED}
    merged[keys.INFERENCE_TOKENS_PER_S_BY_ACTOR] = [stats[keys.INFERENCE_TOKENS_PER_S] for stats in per_server]
    merged[keys.INFERENCE_MEAN_BATCH_SIZE] = merged[keys.INFERENCE_REQUESTS] / max(merged[keys.INFERENCE_BATCHES], 1)
    merged[keys.INFERENCE_BUSY_FRACTION] = sum(s[keys.INFERENCE_BUSY_FRACTION] for s in per_server) / len(per_server)
    return merged


_SUMMED = (
    keys.INFERENCE_REQUESTS,
    keys.INFERENCE_BATCHES,
    keys.INFERENCE_GENERATED_TOKENS,
    keys.INFERENCE_TOKENS_PER_S,
)


class _Counters:
    """Thread-safe throughput counters."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.requests = 0
        self.batches = 0
        self.tokens = 0
        self.busy_s = 0.0
        self.since = time.perf_counter()

    def add(self, results: list[GenerationResult], seconds: float) -> None:
        with self._lock:
            self.requests += len(results)
            self.batches += 1
            self.tokens += sum(len(r.completion_token_ids) for r in results)
            self.busy_s += seconds

    def snapshot(self, reset: bool) -> dict[str, float]:
        with self._lock:
            elapsed = max(time.perf_counter() - self.since, 1e-9)
            stats = {
                keys.INFERENCE_REQUESTS: self.requests,
                keys.INFERENCE_BATCHES: self.batches,
                keys.INFERENCE_GENERATED_TOKENS: self.tokens,
                keys.INFERENCE_TOKENS_PER_S: self.tokens / elapsed,
                keys.INFERENCE_MEAN_BATCH_SIZE: self.requests / max(self.batches, 1),
                keys.INFERENCE_BUSY_FRACTION: self.busy_s / elapsed,
            }
            if reset:
                self._reset()
            return stats
