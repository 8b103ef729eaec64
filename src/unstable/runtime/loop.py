"""The learner loop: wait for a batch, update, hand the new policy to the inference engines, register it with the
pool, log a row, save the resume state when it is due (written on a background thread, `resume.StateWriter`).

With a `handover` (the Ray topology's: the policy's tensors through Ray's object store to every inference actor) the
new policy is servable as soon as every engine holds its tensors; its checkpoint folder, which retention, the pool's
later games and resume read, is written on the background thread, before any state that names it. Without one,
or when an engine cannot take tensors (vLLM), the folder is written first and the engines load it.

The loop is the only part of learning that talks to other components; the `Learner` it holds only updates
weights. It is plain Python: tests run it in-process with plain components, and `runtime.topology` runs it
as the `Learner` Ray actor with proxies to the others.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from unstable.learner import Learner
from unstable.records import Checkpoint, Step, checkpoint_uid
from unstable.runtime import resume
from unstable.tracking import keys


class RunStopped(RuntimeError):
    """The run cannot go on: `reason` says why (e.g. collection stopped and no batch can come)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # an attribute, so it reads the same through Ray's wrapper of a remote error


class LearnerLoop:
    """Drives `learner` with batches from `step_buffer`; checkpoints go to `run_dir/checkpoints/ckpt-<step>`; `handover`
    (optional) hands each new policy to the inference engines in memory (see the module docstring)."""

    def __init__(self, learner: Learner, step_buffer, model_pool, tracker, run_dir: str, handover=None):
        self.learner = learner
        self.handover = handover  # (checkpoint, served weights) -> whether every engine took them in memory
        self.step_buffer = step_buffer
        self.model_pool = model_pool
        self.tracker = tracker
        self.run_dir = Path(run_dir)
        self.writer = resume.StateWriter(self.run_dir, self._prune)
        self._saved_at = time.monotonic()
        self._saved_step: int | None = None
        self._save_seconds = 0.0
        self._logged_at: float | None = None  # when this loop logged its previous row (perf_counter)

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
            began = self._logged_at if self._logged_at is not None else time.perf_counter()
            steps, waited, dropped = self._wait_for_batch()
            metrics = self.learner.train_step(steps)
            synced = time.perf_counter()
            self._publish()
            seconds = time.perf_counter() - began
            metrics |= {
                keys.WEIGHT_SYNC_SECONDS: time.perf_counter() - synced,
                keys.WAIT_SECONDS: waited,
                keys.STEP_SECONDS: seconds,
                keys.WAIT_SHARE: waited / seconds,
                keys.STALE_DROPPED: dropped,
                keys.STATE_SAVE_SECONDS: self._save_seconds,
            }
            rows.append(self.tracker.log(metrics))
            self._logged_at = time.perf_counter()
            resume.pause_for_test(self.run_dir, "after-log", self.learner.step, before=self.writer.wait)
            self._save_seconds = 0.0
            minutes = (time.monotonic() - self._saved_at) / 60
            if self.learner.cfg.resume_state.due(self.learner.step, self.learner.cfg.num_steps, minutes):
                self.save_state()
        return rows

    def _publish(self) -> None:
        """Make the new policy servable and register it with the pool: handed over in memory when every engine takes
        it (its folder then written in the background), else once its folder is written."""
        step, kind = self.learner.step, self.learner.cfg.policy.checkpoint_kind
        path = str(self.run_dir / "checkpoints" / checkpoint_uid(step))
        served = self.learner.served_weights() if self.handover is not None else None
        if served is None:
            self.learner.save_checkpoint(path)
        else:
            in_memory = self.handover(Checkpoint(checkpoint_uid(step), path, step, kind), served)
            self.writer.run(lambda: self.learner.write_checkpoint(path, served), f"checkpoint {path}", f"ckpt-{step}")
            if not in_memory:  # some engine loads it from its folder
                self.writer.wait()
        self.model_pool.add_checkpoint(path=path, iteration=step, kind=kind)

    def save_state(self) -> None:
        """Snapshot this step's resume state (learner, pool, buffer, tracker) and write it on the writer's thread,
        which then deletes the states and checkpoints let go (`_prune`). The row of the step is already in
        `metrics.jsonl`: a kill before the write ends makes the resumed run drop the rows after the previous
        state and redo their steps."""
        start = time.perf_counter()
        step = self.learner.step
        parts = {
            "learner": self.learner.state_dict(),
            "pool": resume.paths_relative(self.model_pool.state_dict(), self.run_dir),
            "buffer": self.step_buffer.state_dict(),
            "tracker": self.tracker.state_dict(),
        }
        referenced = [c.version for c in self.model_pool.active_checkpoints()]
        self.writer.submit(step, resume.snapshot(parts), referenced)
        self._saved_at, self._saved_step = time.monotonic(), step
        self._save_seconds += time.perf_counter() - start

    def close(self) -> None:
        """The run's end: save the state of the last step if it is not saved yet, and wait for the write."""
        if self.learner.step > 0 and self._saved_step != self.learner.step:
            self.save_state()
        self.writer.wait()

    def _prune(self, step: int) -> None:
        """After state `step` is written: keep the newest `resume_state.keep_last` states, and the checkpoints
        retention keeps, a kept state's pool plays (resuming from that state loads them) or a game in flight plays."""
        keep_last = self.learner.cfg.resume_state.keep_last
        states = resume.saved_steps(self.run_dir / resume.STATE_DIR, "step-")
        kept = set(states[-keep_last:]) | {step}
        resume.prune(self.run_dir / resume.STATE_DIR, "step-", lambda k: k in kept)
        retention, referenced = self.learner.cfg.retention, resume.referenced_checkpoints(self.run_dir)
        referenced |= set(self.model_pool.in_play())  # a game in flight may load it again
        resume.prune(self.run_dir / "checkpoints", "ckpt-", lambda k: k in referenced or retention.keeps(k, step))

    def restore(self, state_dir: str) -> int:
        """Load a saved state (`resume.latest_state`) into the learner, pool, buffer and tracker; returns its step."""
        directory = Path(state_dir)
        self.learner.load_state_dict(resume.load_part(directory, "learner"))
        self.model_pool.load_state_dict(resume.paths_under(resume.load_part(directory, "pool"), self.run_dir))
        self.step_buffer.load_state_dict(resume.load_part(directory, "buffer"))
        self.tracker.load_state_dict(resume.load_part(directory, "tracker"))
        resume.discard_after(self.run_dir, self.learner.step)
        self._saved_step = self.learner.step
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
