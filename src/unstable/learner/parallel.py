"""Data-parallel learners: the ranks that train one model together, each on an equal shard of every batch.

`DataParallel` is one learner process's place among them (its rank, how many) and the few collectives the
`Learner` needs: the trainable weights broadcast from rank 0 once they exist, the gradients averaged before
clipping (so every rank takes the identical step), the metrics averaged for the row rank 0 logs. An algorithm
takes its rank's part of a batch with `shard`; averaging the shards' mean losses gives the batch's mean loss
because the shards are equal. One learner (`world_size` 1) has no process group: every call is then the plain
one-learner behaviour.

With `sharding` 'fsdp' (full fine-tuning) the model's parameters, gradients and optimizer state are sharded over
the ranks with FSDP2 (`shard_model`: each decoder layer, then the rest): FSDP itself averages those
gradients (a reduce-scatter in the backward pass), so the collectives above touch only the parameters outside
the model, and the whole weights and optimizer state are gathered for checkpoints and resume states (every rank
calls `full_model_state`, `whole_copy` and `full_optimizer_state` together).

Plain torch.distributed (gloo on the CPU, NCCL on cuda): `unstable.runtime` starts the processes as Ray actors and
gives every rank rank 0's address (`join`).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

# A rank that died leaves the others waiting in a collective; they give up after this long.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
# Gradients are averaged in flat buffers of at most this many elements (one collective each, bounded memory).
BUCKET_ELEMENTS = 1 << 24


def free_port() -> int:
    """A TCP port that is free on this machine now (for rank 0's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class DataParallel:
    """Learner rank `rank` of `world_size`, its collectives on `device` (`cuda`: NCCL, else gloo), the model
    sharded over the ranks when `sharding` is 'fsdp'."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu", sharding: str = "none"):
        if not 0 <= rank < world_size:
            raise ValueError(f"learner rank {rank} is not in 0..{world_size - 1}")
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.sharded = sharding == "fsdp" and world_size > 1

    @property
    def backend(self) -> str:
        """The torch.distributed backend of the learners' process group."""
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def join(self, address: str, port: int) -> None:
        """Join the process group whose rank 0 listens on `address:port`; returns once every rank joined."""
        if self.world_size > 1:
            dist.init_process_group(
                self.backend,
                init_method=f"tcp://{address}:{port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=COLLECTIVE_TIMEOUT,
            )

    def close(self) -> None:
        """Leave the process group, if this process joined one."""
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def shard(self, steps: Sequence[T]) -> list[T]:
        """This rank's equal, contiguous part of `steps` (all of them for one learner)."""
        size, rest = divmod(len(steps), self.world_size)
        if rest:
            raise ValueError(f"{len(steps)} steps do not split into {self.world_size} equal shards")
        return list(steps[self.rank * size : (self.rank + 1) * size])

    def shard_model(self, root: torch.nn.Module, model: torch.nn.Module) -> None:
        """With sharding, shard the causal LM `model` in place with FSDP2: each decoder layer (its weights gathered
        only while it runs), then the rest (embeddings, final norm, output layer, tied or not) as the unit of
        `root`, the module whose forward runs every pass over `model`. Every rank calls it together."""
        if not self.sharded:
            return
        from torch.distributed.fsdp import fully_shard

        for layer in model.get_decoder().layers:
            fully_shard(layer)
        fully_shard(root)

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """With sharding, `model`'s whole state dict gathered onto rank 0's CPU (other ranks get an empty dict);
        None without sharding. Every rank calls it together."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """`optimizer.state_dict()`; with sharding the full (unsharded) state keyed by parameter name, gathered
        onto rank 0's CPU (other ranks get an empty dict). Every rank calls it together."""
        if not self.sharded:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load what `full_optimizer_state` returned on rank 0 (every rank is given it): with sharding each rank
        keeps its shard of it."""
        if not self.sharded:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Overwrite every rank's `params` with rank 0's (a sharded parameter is left as it is: every rank loaded
        its shard from the same weights)."""
        if self.world_size > 1:
            with torch.no_grad():
                for param in _replicated(params):
                    dist.broadcast(param.data, src=0)

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each gradient by its mean over the ranks. A parameter with a gradient on any rank gets one on
        every rank (zeros where it had none), so the ranks' optimizers step the same parameters. A sharded
        parameter is skipped: FSDP has already averaged its gradient."""
        if self.world_size == 1:
            return
        params = _replicated(params)
        has_grad = self.all_reduce([float(p.grad is not None) for p in params], "max")
        grads = []
        for param, needed in zip(params, has_grad):
            if needed and param.grad is None:
                param.grad = torch.zeros_like(param)
            if needed:
                grads.append(param.grad)
        for bucket in _buckets(grads, BUCKET_ELEMENTS):
            flat = torch.cat([g.reshape(-1) for g in bucket])  # (n,)
            dist.all_reduce(flat)
            flat /= self.world_size
            for grad, part in zip(bucket, flat.split([g.numel() for g in bucket])):
                grad.copy_(part.view_as(grad))

    def average_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric's mean over the ranks (every rank reports the same keys)."""
        if self.world_size == 1:
            return metrics
        names = sorted(metrics)
        totals = self.all_reduce([metrics[name] for name in names])
        return {name: total / self.world_size for name, total in zip(names, totals)}

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """`values` combined element-wise over the ranks by `op`, 'sum' or 'max' (in float64)."""
        if self.world_size == 1:
            return [float(v) for v in values]
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)  # (k,)
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return tensor.tolist()


def _sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is an FSDP shard (a DTensor). torch's DTensor module (0.6 s to import, with sympy) is loaded
    only by sharding (`shard_model`): a process that never imported it holds no DTensor, and `unstable train`'s
    driver, which imports this module, does not pay for it."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of `tensor`: gathered from every rank when it is sharded (every rank calls it together)."""
    return tensor.full_tensor() if _sharded(tensor) else tensor


def whole_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole `tensor`; a sharded one is gathered from every rank (which call it together) onto the CPU,
    so that no device ever holds more than one whole weight at a time."""
    if _sharded(tensor):
        return tensor.full_tensor().cpu()
    return tensor.detach().clone()


def assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """Copy the whole `value` into `param`; a sharded `param` takes its own shard of it."""
    if _sharded(param):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements)
    param.copy_(value)


def _replicated(params: Sequence[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters of `params` that every rank holds whole (not sharded by FSDP)."""
    return [p for p in params if not _sharded(p)]


def _buckets(tensors: list[torch.Tensor], max_elements: int) -> list[list[torch.Tensor]]:
    """`tensors` in order, cut into runs of one dtype with at most `max_elements` elements (a larger tensor alone)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        if not buckets or buckets[-1][0].dtype != tensor.dtype or size + tensor.numel() > max_elements:
            buckets.append([])
            size = 0
        buckets[-1].append(tensor)
        size += tensor.numel()
    return buckets
