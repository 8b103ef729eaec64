"""The processes that train one agent together: just this one, or those started by `accelerate launch`.

Each process collects and trains on its own episodes; after every backward pass the gradients are averaged
across processes (`mean_grads`) and every process takes the same number of optimizer steps (`max_int` on the
minibatch counts), so the weights stay identical without wrapping the agent in DDP. Without Accelerate (or
under one process) every call here is a no-op.

At exit (`close`, registered with `atexit`) the process group is destroyed and Gloo's worker threads get a moment
with the interpreter still alive: a thread that frees a finished collective's tensors needs the GIL, and one that
asks for it once the interpreter is shutting down aborts the process (SIGABRT, "terminate called without an active
exception") after training already finished.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterable

import torch

from unstable.rl.config import ACCELERATE_MODES

GLOO_RELEASE_SECONDS = 0.2


def launched_by_accelerate() -> bool:
    """Whether this process was started by `accelerate launch` (or another torch.distributed launcher)."""
    return "WORLD_SIZE" in os.environ or any(name.startswith("ACCELERATE_") for name in os.environ)


class Cluster:
    """This process's place among the training processes, and the few collectives the trainer needs."""

    def __init__(self, use_accelerate: str = "auto", device: str = "cpu") -> None:
        if use_accelerate not in ACCELERATE_MODES:
            raise ValueError(f"use_accelerate={use_accelerate!r} is not one of {ACCELERATE_MODES}")
        self.accelerator = None
        if use_accelerate == "always" or (use_accelerate == "auto" and launched_by_accelerate()):
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=device == "cpu")
            atexit.register(self.close)
        self.device = self.accelerator.device if self.accelerator else torch.device(device)

    @property
    def num_processes(self) -> int:
        """How many processes train together."""
        return self.accelerator.num_processes if self.accelerator else 1

    @property
    def process_index(self) -> int:
        """This process's rank, 0 to `num_processes - 1`."""
        return self.accelerator.process_index if self.accelerator else 0

    @property
    def is_main_process(self) -> bool:
        """Whether this process writes checkpoints and logs."""
        return self.accelerator.is_main_process if self.accelerator else True

    def max_int(self, value: int) -> int:
        """The largest `value` over all processes."""
        if self.num_processes == 1:
            return value
        gathered = self.accelerator.gather(torch.tensor([value], device=self.device))  # (num_processes,)
        return int(gathered.max().item())

    def mean_grads(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Average every parameter's gradient over the processes (a missing gradient counts as zeros)."""
        if self.num_processes == 1:
            return
        for param in parameters:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            param.grad.copy_(self.accelerator.reduce(param.grad, reduction="mean"))

    def close(self) -> None:
        """Destroy the process group, if one was started (no collective: a failed process must not wait for the
        others); safe to call again."""
        if self.num_processes > 1 and torch.distributed.is_initialized():
            self.accelerator.end_training()
            time.sleep(GLOO_RELEASE_SECONDS)  # releases the GIL: Gloo's threads free the last collectives' tensors

    def wait_for_everyone(self) -> None:
        """Barrier: return once every process got here."""
        if self.accelerator:
            self.accelerator.wait_for_everyone()
