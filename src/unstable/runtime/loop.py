"""The learner loop: wait for a batch, update, save the checkpoint, register it with the pool, log a row, save
the resume state.

The loop is the only part of learning that talks to other components; the `Learner` it holds only updates
weights. It is plain Python: tests run it in-process with plain components, and `runtime.topology` runs it
as the `Learner` Ray actor with proxies to the others.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from unstable.learner import Learner
from unstable.records import Step
from unstable.runtime import resume
from unstable.tracking import keys


class RunStopped(RuntimeError):
    """The run cannot go on: `reason` says why (e.g. collection stopped and no batch can come)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # an attribute, so it reads the same through Ray's wrapper of a remote error


class LearnerLoop:
    """Drives `learner` with batches from `step_buffer`; checkpoints go to `run_dir/checkpoints/ckpt-<step>`."""

    def __init__(self, learner: Learner, step_buffer, model_pool, tracker, run_dir: str):
        self.learner = learner
        self.step_buffer = step_buffer
        self.model_pool = model_pool
        self.tracker = tracker
        self.run_dir = Path(run_dir)

    def initialize(self) -> None:
        """Load the model and build the optimizer (the heavy start-up, separate from construction)."""
        self.learner.initialize()

    def train(self, num_steps: int) -> list[dict[str, Any]]:
        """Run `num_steps` updates; returns the tracker's row of each.

        With `max_staleness` set, steps sampled more than that many updates ago are dropped from each batch
        (counted as `learner/stale_dropped`); a batch left empty is replaced by the next one.
        """
        self.learner.initialize()
        rows = []
        for _ in range(num_steps):
            steps, waited, dropped = self._wait_for_batch()
            metrics = self.learner.train_step(steps)
            directory = self.run_dir / "checkpoints" / f"ckpt-{self.learner.step}"
            path = self.learner.save_checkpoint(str(directory))
            self.model_pool.add_checkpoint(
                path=path, iteration=self.learner.step, kind=self.learner.cfg.checkpoint_kind
            )
            metrics |= {keys.WAIT_SECONDS: waited, keys.STALE_DROPPED: dropped}
            rows.append(self.tracker.log(metrics))
            resume.pause_for_test(self.run_dir, "after-log", self.learner.step)
            self.save_state()
        return rows

    def save_state(self) -> None:
        """Write this step's resume state (learner, pool, buffer, tracker) atomically, then delete the checkpoints
        and states retention lets go. The row of the step is already in `metrics.jsonl`: a kill before this
        save ends makes the resumed run drop that row and redo the step."""
        step = self.learner.step
        parts = {
            "learner": self.learner.state_dict(),
            "pool": self.model_pool.state_dict(),
            "buffer": self.step_buffer.state_dict(),
            "tracker": self.tracker.state_dict(),
        }
        resume.save_run_state(self.run_dir, step, parts)
        retention = self.learner.cfg.retention
        in_play = {c.version for c in self.model_pool.active_checkpoints()}
        resume.prune(self.run_dir / "checkpoints", "ckpt-", lambda k: k in in_play or retention.keeps(k, step))
        resume.prune(self.run_dir / resume.STATE_DIR, "step-", lambda k: k == step or retention.keeps(k, step))

    def restore(self, state_dir: str) -> int:
        """Load a saved state (`resume.latest_state`) into the learner, pool, buffer and tracker; returns its step."""
        directory = Path(state_dir)
        self.learner.load_state_dict(resume.load_part(directory, "learner"))
        self.model_pool.load_state_dict(resume.load_part(directory, "pool"))
        self.step_buffer.load_state_dict(resume.load_part(directory, "buffer"))
        self.tracker.load_state_dict(resume.load_part(directory, "tracker"))
        return self.learner.step

    def _wait_for_batch(self) -> tuple[list[Step], float, int]:
        """Block until the buffer yields a batch with fresh steps; returns them, the seconds waited and the
        number of stale steps dropped on the way. Raises RunStopped, with the cause, when collection stopped and
        the buffer cannot fill a batch."""
        cfg = self.learner.cfg
        start = time.perf_counter()
        dropped = 0
        while True:
            while self.step_buffer.size() < cfg.batch_size:
                if (cause := self.step_buffer.stop_cause()) is not None and self.step_buffer.size() < cfg.batch_size:
                    raise RunStopped(f"no training batch can come: collection stopped: {cause}")
                time.sleep(cfg.poll_interval_s)
            steps, stale = self.learner.drop_stale(self.step_buffer.get_batch(cfg.batch_size))
            dropped += stale
            if steps:
                return steps, time.perf_counter() - start, dropped
