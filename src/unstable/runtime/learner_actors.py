"""The learner's Ray actors: rank 0's learner loop and the other ranks of a learner group, thin shells like those of
`runtime.actors` (apart from them so that the light actors' Ray workers never import torch).
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from unstable.algorithms.base import BaseAlgo
from unstable.learner import Learner, LearnerConfig, PolicyModel
from unstable.learner.learner import learner_parts
from unstable.learner.parallel import DataParallel, free_port
from unstable.runtime.actors import SHELL, _log_with, log_to_run_dir
from unstable.runtime.loop import LearnerLoop
from unstable.runtime.remote import RemoteProxy

log = logging.getLogger(__name__)


@ray.remote(**SHELL)
class LearnerActor(LearnerLoop):
    """The learner loop under `cfg`, training the base model at `model_path` (weights in `dtype`) with `algorithm`:
    rank 0 of the learner group (`topology.start_learner_group`).

    Checkpoints go under the tracker's run directory. The model trains on cuda when `cfg.num_gpus` says so, or when
    Ray gave this actor GPUs that torch sees (`_on_given_gpus`). It has no sampling settings of its own: each step is
    scored under the temperature and top_p it was sampled with. Given the other ranks' actors (`ranks`, in rank
    order: `LearnerRankActor`s) it joins them in one process group at its node's address and calls them with its
    own learner (`RankZeroLearner`). Given `inference_servers` and `cfg.weight_handover` 'memory', it hands each
    new policy to them through Ray's object store (`hand_over`); else they load each checkpoint's folder.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        step_buffer,
        model_pool,
        tracker,
        algorithm: BaseAlgo,
        *,
        dtype: str = "float32",
        inference_servers: list | None = None,
        ranks: list | None = None,
    ):
        cfg = _on_given_gpus(cfg)
        policy, parallel = learner_parts(model_path, cfg, dtype=dtype)
        run_dir = ray.get(tracker.get_run_dir.remote())
        log_to_run_dir(run_dir, "learner")
        if ranks:
            learner = RankZeroLearner(policy, algorithm, cfg, parallel, ranks)
        else:
            learner = Learner(policy, algorithm, cfg, parallel)
        in_memory = inference_servers and cfg.weight_handover == "memory"
        super().__init__(
            learner,
            RemoteProxy(step_buffer),
            RemoteProxy(model_pool),
            RemoteProxy(tracker),
            run_dir,
            handover=functools.partial(hand_over, inference_servers) if in_memory else None,
        )

    def train(self, num_steps: int, stop_collection: bool = True) -> list[dict[str, Any]]:
        """`num_steps` updates; then, unless told otherwise, write the last state (`close`) and tell the collector to
        start no new games."""
        rows = super().train(num_steps)
        if stop_collection:
            self.close()
            self.step_buffer.stop_collection()
        return rows


def hand_over(servers: list, checkpoint, served) -> bool:
    """Offer a new policy's `served` weights for `checkpoint` to every inference actor in `servers`, put in Ray's
    object store once; returns whether every one took them in memory. An actor that died since (Ray restarts it)
    counts as one that did not: it reads the checkpoint's folder."""
    shared = ray.put(served)
    offers = [server.offer.remote(checkpoint, shared) for server in servers]
    try:
        return all(ray.get(offers))
    except ray.exceptions.RayActorError:
        return False


def _on_given_gpus(cfg: LearnerConfig) -> LearnerConfig:
    """`cfg`, with `num_gpus` the GPUs Ray gave this learner actor when it has some that torch sees and `cfg` names
    none (the original API gives them in the actor's options, `StandardLearner.options(num_gpus=1)`): the model then
    trains on cuda."""
    import torch

    if ray.get_gpu_ids() and torch.cuda.is_available() and not cfg.num_gpus:
        return cfg.model_copy(update={"num_gpus": float(len(ray.get_gpu_ids()))})
    return cfg


RANK_POLL_S = 0.5  # how often rank 0 looks at the other ranks' calls while its own runs
# test hook: "<rank>" makes that learner rank's first update fail (a rank that breaks while the others wait for it
# in a collective)
FAIL_RANK_ENV = "UNSTABLE_TEST_FAIL_LEARNER_RANK"


def _leaving_on_failure(method):
    """`method` of a learner rank, which on an exception leaves the learners' process group before raising it: the
    other ranks' collectives then fail at once instead of waiting for it until the collective timeout."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception:
            log.error("learner rank %d failed in %s: leaving the process group", self.parallel.rank, method.__name__)
            self.parallel.close()
            raise

    return wrapped


@ray.remote(**SHELL)
class LearnerRankActor(Learner):
    """Rank `rank` (> 0) of the `cfg.num_learners` data-parallel learners of the learner group
    (`topology.start_learner_group`), whose rank 0 (the `LearnerActor`) calls it together with its own learner
    (`RankZeroLearner`): it trains on its shard of each batch and saves, registers and logs nothing. Its warnings go
    to `logs/learner-<rank>.log` in the run directory of `tracker`. A call that fails leaves the process group, so
    the others fail at once (`_leaving_on_failure`)."""

    def __init__(self, cfg: LearnerConfig, model_path: str, algorithm: BaseAlgo, rank: int, tracker, dtype: str):
        _log_with(tracker, f"learner-{rank}")
        cfg = _on_given_gpus(cfg)
        policy, parallel = learner_parts(model_path, cfg, dtype=dtype, rank=rank)
        super().__init__(policy, algorithm, cfg, parallel)

    def join(self, address: str, port: int) -> None:
        """Join the learners' process group at rank 0's `address:port`."""
        self.parallel.join(address, port)

    initialize = _leaving_on_failure(Learner.initialize)
    load_state_dict = _leaving_on_failure(Learner.load_state_dict)
    save_checkpoint = _leaving_on_failure(Learner.save_checkpoint)

    @_leaving_on_failure
    def train_step(self, steps: list) -> dict[str, Any]:
        """This rank's part of the update on `steps`."""
        if os.environ.get(FAIL_RANK_ENV) == str(self.parallel.rank):
            raise RuntimeError(f"learner rank {self.parallel.rank} fails its update: {FAIL_RANK_ENV} is set")
        return super().train_step(steps)

    @_leaving_on_failure
    def state_dict(self) -> None:
        """Take part in gathering a sharded model's state onto rank 0, which keeps it; nothing comes back."""
        super().state_dict()


class RankZeroLearner(Learner):
    """Rank 0 of data-parallel learners (`parallel`), inside the `LearnerActor`: the calls every rank makes together
    (joining, `initialize` with its weight broadcast, `train_step`, `load_state_dict`, and with a sharded model
    `save_checkpoint` and `state_dict`) are sent to the other ranks' actors (`ranks`, in rank order) and then run
    here, since the collectives inside them wait for every rank."""

    def __init__(
        self, policy: PolicyModel, algorithm: BaseAlgo, cfg: LearnerConfig, parallel: DataParallel, ranks: list
    ):
        super().__init__(policy, algorithm, cfg, parallel)
        self.ranks = ranks
        # one thread for rank 0's own calls, kept for the run: a new thread per update grew the actor's memory by
        # ~33 MB per learner step (the demo, two ranks), which one long-lived thread does not
        self._own_calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner-rank-0")
        address, port = ray.util.get_node_ip_address(), free_port()
        self._with_ranks("join", self.parallel.join, address, port)

    def initialize(self) -> None:
        """Initialize every rank (rank 0's weights are broadcast to the others); idempotent."""
        if self.optimizer is None:
            self._with_ranks("initialize", super().initialize)

    def train_step(self, steps: list) -> dict[str, Any]:
        """Every rank's update on its shard of `steps`; returns the metrics averaged over the ranks."""
        return self._with_ranks("train_step", super().train_step, steps)

    def save_checkpoint(self, directory: str) -> str:
        """Save the weights to `directory`; a sharded model's are gathered from every rank first."""
        if not self.parallel.sharded:
            return super().save_checkpoint(directory)
        return self._with_ranks("save_checkpoint", super().save_checkpoint, directory)

    def state_dict(self) -> dict[str, Any]:
        """The resume state; a sharded model's weights and optimizer state are gathered from every rank."""
        if not self.parallel.sharded:
            return super().state_dict()
        self.initialize()
        return self._with_ranks("state_dict", super().state_dict)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rank 0's saved `state` on every rank."""
        self.initialize()
        self._with_ranks("load_state_dict", super().load_state_dict, state)

    def _with_ranks(self, method: str, here, *args):
        """Call `method` on the other ranks' actors and `here` (rank 0's own, on its thread), with `args` put in Ray's
        object store once; returns rank 0's result once every rank finished. The other ranks are watched while
        rank 0's call runs: one that fails raises its error (the cause) at once, however long rank 0's call would
        wait for it in a collective (until the collective timeout, 30 minutes, before); the run then stops."""
        shared = [ray.put(arg) for arg in args]
        others = [getattr(rank, method).remote(*shared) for rank in self.ranks]
        own = self._own_calls.submit(here, *args)
        while not futures.wait([own], timeout=RANK_POLL_S).done:
            if (failure := _rank_failure(others)) is not None:
                raise failure
        if own.exception() is not None:
            raise _rank_failure(others, wait_s=10.0) or own.exception()
        ray.get(others)
        return own.result()


def _rank_failure(calls: list, wait_s: float = 0.0) -> RuntimeError | None:
    """The error of the first of the other ranks' `calls` (rank 1, 2, ...) that failed among those ended within
    `wait_s`, None when none did."""
    ended, _ = ray.wait(calls, num_returns=len(calls), timeout=wait_s)
    for rank, call in enumerate(calls, 1):
        if call in ended:
            try:
                ray.get(call)
            except Exception as exc:  # noqa: BLE001 - returned as the cause
                cause = getattr(exc, "cause", None) or exc  # the rank's own error, not Ray's wrapper of it
                return RuntimeError(f"learner rank {rank} failed: {type(cause).__name__}: {cause}")
    return None
