"""Several data-parallel learners: two ranks (gloo, two processes) end with the weights one learner reaches on the
same global batches, for every algorithm that shards; those that cannot shard exactly are refused; through
`unstable train`, two learner actors train, log each step once and resume after a kill."""

import json
import math
import os
import random
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from unstable.algorithms import ALGORITHMS
from unstable.learner import Learner, LearnerConfig
from unstable.learner.parallel import DataParallel
from unstable.records import Step
from unstable.tracking import keys

from .runs import EXAMPLE, tiny_run
from .test_resume_kill import _kill_when_paused, _latest_step, _start, _steps

# algorithm name and arguments: each path that splits a batch (per batch, per minibatch of shuffled epochs, after
# batch-wide advantages, with a value head bootstrapping on next states)
SHARDED = [
    ("reinforce", {}),
    ("group_baseline", {"scale_by_std": True}),
    ("ppo", {"epochs": 2, "minibatch_size": 4, "whiten_advantages": True}),
    ("a2c", {"bootstrap": 0.5, "value_hidden_sizes": [8]}),
]
# the algorithms tested with the model sharded over the ranks (full fine-tuning, learner.sharding fsdp)
FSDP = [("reinforce", {}), ("ppo", {"epochs": 2, "minibatch_size": 4, "whiten_advantages": True})]
BATCH, STEPS = 8, 3
# Full fine-tuning moves every weight by about the learning rate per AdamW step (1e-3 here, 3e-3 in 3 steps);
# summing the gradients in another order (two ranks, two shards, other micro-batches) moves a weight whose gradient
# is near AdamW's eps by a few percent of that, as the unsharded two-rank learners do too (measured: 2.9e-5 after 3
# reinforce steps either way; 1.1e-4 for 1 weight in 16,384 with micro-batches of a few rows).
FULL_ATOL, FULL_ATOL_RARE = 1e-5, 3e-4


def _close_up_to_adam_noise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """All of `actual` within `FULL_ATOL_RARE` of `expected`, and all but 0.1% within `FULL_ATOL`."""
    diff = (actual - expected).abs()
    assert diff.max() <= FULL_ATOL_RARE, f"{what}: {diff.max():.3g} apart"
    assert (diff > FULL_ATOL).float().mean() <= 1e-3, f"{what}: {(diff > FULL_ATOL).sum()} of {diff.numel()} apart"


RANKS_TIMEOUT_S = 600


def _batches() -> list[list[Step]]:
    """`STEPS` global batches of `BATCH` steps of varied lengths, rewards, groups and next states."""
    rng = random.Random(0)
    batches = []
    for _ in range(STEPS):
        batch = []
        for i in range(BATCH):
            completion = tuple(rng.randrange(5, 60) for _ in range(rng.randint(1, 4)))
            batch.append(
                Step(
                    "E",
                    i % 2,
                    0,
                    "o",
                    "a",
                    prompt_token_ids=tuple(rng.randrange(5, 60) for _ in range(rng.randint(2, 6))),
                    completion_token_ids=completion,
                    behaviour_logprobs=tuple(-rng.uniform(0.5, 4.0) for _ in completion),
                    reward=rng.choice([-1.0, 0.0, 1.0]),
                    group_id=f"g{rng.randrange(3)}" if i < 6 else None,
                    next_prompt_token_ids=tuple(rng.randrange(5, 60) for _ in range(3)) if i % 3 else (),
                )
            )
        batches.append(batch)
    return batches


def _config(num_learners: int, name: str, args: dict, sharding: str | None = None) -> LearnerConfig:
    """LoRA learners, or with `sharding` full fine-tuning learners sharded so ('none': not at all) in micro-batches
    of a few rows (a different number on each rank: sharded ranks must still run their passes together)."""
    full = {"lora": None, "micro_batch_tokens": 24}
    return LearnerConfig(
        batch_size=BATCH,
        num_learners=num_learners,
        sharding=sharding or "none",
        policy=full if sharding else {"lora": {"lora_rank": 4, "lora_alpha": 8}},
        optimizer={"learning_rate": 1e-3},
        algorithm={"name": name, "args": args},
    )


def _train(model_dir: str, cfg: LearnerConfig, rank: int = 0, port: int | None = None) -> dict[str, torch.Tensor]:
    """The trainable weights (the policy's and the algorithm's) after `STEPS` updates on `_batches()`; rank `rank`
    of `cfg.num_learners` joins the others at `port` first."""
    state = _run(model_dir, cfg, rank, port, _batches())
    return state["policy"] | {f"algorithm.{k}": v for k, v in state["algorithm"].get("value_head", {}).items()}


def _run(model_dir, cfg, rank, port, batches, *, start=None, checkpoint=None, memory=None) -> dict:
    """The learner state after `batches` from `start` (a saved state, else the model), rank `rank` of
    `cfg.num_learners` joined to the others at `port`; with `checkpoint` the weights are saved there at the end, with
    `memory` (a dict) the bytes of this rank's parameters, gradients and optimizer state are put into it."""
    torch.manual_seed(rank)  # a different LoRA start on each rank: the broadcast from rank 0 must even them out
    learner = Learner.build(model_dir, cfg.algorithm.build(), cfg, rank=rank)
    if port is not None:
        learner.parallel.join("127.0.0.1", port)
    try:
        learner.initialize()
        if start is not None:
            learner.load_state_dict(start)
        for batch in batches:
            learner.train_step(batch)
        if memory is not None:
            memory |= _training_bytes(learner)
        if checkpoint is not None:
            learner.save_checkpoint(checkpoint)
        return learner.state_dict()
    finally:
        learner.parallel.close()


def _local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this process holds of `tensor` (its own shard of a sharded one)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _training_bytes(learner: Learner) -> dict[str, int]:
    """Bytes of this rank's trainable parameters, their gradients (after one backward pass, then dropped) and the
    optimizer state, from the tensors' local shards."""
    params = [p for group in learner.optimizer.param_groups for p in group["params"]]
    batch = learner.micro_batches(learner.shard(_batches()[0]))[0]
    learner.forward(batch).logprobs.sum().backward()
    grads = sum(_local_bytes(p.grad) for p in params if p.grad is not None)
    learner.optimizer.zero_grad(set_to_none=True)
    state = learner.optimizer.state.values()
    optimizer = sum(_local_bytes(v) for s in state for v in s.values() if torch.is_tensor(v) and v.dim())
    return {"parameters": sum(_local_bytes(p) for p in params), "gradients": grads, "optimizer": optimizer}


def _rank(rank: int, model_dir: str, port: int, out: str) -> None:
    torch.set_num_threads(1)
    results = {
        name: _train(model_dir, _config(2, name, args), rank, port + i) for i, (name, args) in enumerate(SHARDED)
    }
    torch.save(results, f"{out}/rank{rank}.pt")


def _free_ports(count: int) -> int:
    """A port number whose `count` successors are free too, between Ray's worker ports (10002-19999) and the
    kernel's ephemeral ones: the ranks listen on them one after another for seconds, and an outgoing connection (the
    ranks' own among them) may be given any free ephemeral port meanwhile (both tests below failed so in one
    `make test`: EADDRINUSE, when the ports were drawn from the ephemeral range)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    first_ephemeral = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    while True:
        start = random.randrange(20000, first_ephemeral - count)
        if all(_port_free(start + i) for i in range(count)):
            return start


def _port_free(port: int) -> bool:
    """Whether nothing listens on `port` on any address (as the ranks' store listens)."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
        return True


def test_two_learner_ranks_reach_the_weights_of_one_learner_on_the_same_global_batches(
    tiny_model_dir, tmp_path, one_torch_thread
):
    ranks = _spawn_ranks(_rank, tiny_model_dir, len(SHARDED), tmp_path)
    for name, args in SHARDED:
        torch.manual_seed(0)
        one = _train(tiny_model_dir, _config(1, name, args))
        torch.manual_seed(0)
        start = Learner.build(tiny_model_dir, ALGORITHMS[name](**args), _config(1, name, args))
        start.initialize()
        initial = start.policy.trainable_state()
        assert ranks[0][name].keys() == ranks[1][name].keys() == one.keys()
        moved = max((one[k] - initial[k]).abs().max().item() for k in initial)
        assert moved > 1e-4, f"{name}: the updates barely moved the weights, the comparison would say nothing"
        for key, value in one.items():
            torch.testing.assert_close(ranks[0][name][key], ranks[1][name][key], rtol=0, atol=0, msg=f"{name} {key}")
            torch.testing.assert_close(ranks[0][name][key], value, rtol=1e-4, atol=2e-6, msg=f"{name} {key}")


def _spawn_ranks(function, model_dir: str, ports: int, out) -> list[dict]:
    """What `function(rank, model_dir, first_port, out)` saved as `out/rank<r>.pt` in each of two processes."""
    ranks = mp.spawn(function, args=(model_dir, _free_ports(ports), str(out)), nprocs=2, join=False)
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not ranks.join(timeout=5):  # raises when a rank fails
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"the two learner ranks did not finish in {RANKS_TIMEOUT_S} s (a collective hangs?)")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _fsdp_rank(rank: int, model_dir: str, port: int, out: str) -> None:
    """Per algorithm of `FSDP`, two sharded ranks: 3 steps (then the checkpoint and the memory), and a resume: 2
    steps, rank 0's state saved, loaded into fresh learners, step 3."""
    torch.set_num_threads(1)
    results = {}
    for i, (name, args) in enumerate(FSDP):
        cfg, batches = _config(2, name, args, "fsdp"), _batches()
        memory = {}
        state = _run(model_dir, cfg, rank, port + 3 * i, batches, checkpoint=f"{out}/{name}-ckpt", memory=memory)
        saved = _run(model_dir, cfg, rank, port + 3 * i + 1, batches[:2])
        if rank == 0:
            torch.save(saved, f"{out}/{name}-state.tmp")
            os.replace(f"{out}/{name}-state.tmp", f"{out}/{name}-state.pt")
        after = _run(model_dir, cfg, rank, port + 3 * i + 2, batches[2:], start=_load_when_saved(out, name))
        results[name] = {"weights": state["policy"], "resumed": after["policy"], "memory": memory}
    torch.save(results, f"{out}/rank{rank}.pt")


def _load_when_saved(out: str, name: str) -> dict:
    """Rank 0's saved state of `name` (every rank reads the one file)."""
    path = f"{out}/{name}-state.pt"
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not os.path.exists(path) and time.monotonic() < deadline:  # rank 0 renames it into place when written
        time.sleep(0.1)
    return torch.load(path, weights_only=False)


def test_two_sharded_learner_ranks_reach_one_learners_weights_save_whole_models_and_resume(
    tiny_model_dir, tmp_path, one_torch_thread
):
    ranks = _spawn_ranks(_fsdp_rank, tiny_model_dir, 3 * len(FSDP), tmp_path)
    for name, args in FSDP:
        torch.manual_seed(0)
        one_memory = {}
        one = _run(tiny_model_dir, _config(1, name, args, "none"), 0, None, _batches(), memory=one_memory)["policy"]
        initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        moved = max((one[k] - initial[k]).abs().max().item() for k in one)
        assert moved > 1e-4, f"{name}: the updates barely moved the weights, the comparison would say nothing"
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / f"{name}-ckpt").state_dict()  # what engines load
        for key, value in one.items():
            for rank in ranks:
                _close_up_to_adam_noise(rank[name]["weights"][key], value, f"{name} {key}")
                torch.testing.assert_close(rank[name]["resumed"][key], rank[name]["weights"][key], rtol=0, atol=0)
            _close_up_to_adam_noise(saved[key], value, f"{name} checkpoint {key}")
        for rank, held in enumerate(ranks):
            print(f"{name}: rank {rank} of 2 (fsdp) holds {held[name]['memory']}, one learner {one_memory}")
            for part, size in held[name]["memory"].items():
                assert size <= one_memory[part] * 0.55, f"{name} {part}: rank {rank} holds {size} of {one_memory[part]}"


@pytest.mark.parametrize(
    "name, args, why",
    [
        ("vtrace_awr", {}, "value head on minibatches of the whole batch"),
        ("sft", {}, "completion tokens"),
        ("ppo", {"minibatch_size": 3}, "minibatch_size 3"),
    ],
)
def test_algorithms_that_cannot_shard_exactly_refuse_several_learners(name, args, why):
    with pytest.raises(ValueError, match=why):
        _config(2, name, args)
    _config(1, name, args)  # one learner is fine


def test_batch_size_must_split_into_equal_shards():
    with pytest.raises(ValueError, match="batch_size 8 does not split into 3 equal shards"):
        LearnerConfig(batch_size=8, num_learners=3)


def test_each_rank_takes_its_own_equal_contiguous_shard():
    steps = list(range(8))
    assert [DataParallel(rank, 2).shard(steps) for rank in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert DataParallel().shard(steps) == steps  # one learner: the whole batch
    with pytest.raises(ValueError, match="7 steps do not split into 2 equal shards"):
        DataParallel(0, 2).shard(steps[:7])


def test_with_max_staleness_the_fresh_steps_are_cut_to_equal_shards():
    cfg = LearnerConfig(batch_size=4, num_learners=2, max_staleness=1)
    learner = Learner(None, cfg.algorithm.build(), cfg, DataParallel(0, 2))  # no model: drop_stale needs none
    learner.step = 3
    steps = [replace(_batches()[0][0], policy_version=v) for v in (3, 2, 2, 0)]
    fresh, dropped = learner.drop_stale(steps)
    assert [s.policy_version for s in fresh] == [3, 2] and dropped == 2  # one stale, one cut off


@pytest.mark.slow  # runs of unstable train
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_two_learner_actors_through_unstable_train_log_each_step_once_and_resume(tiny_model_dir, tmp_path, _ray_head):
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "two-learners",
        "warm_start=null",
        "learner.num_learners=2",
        "learner.num_steps=3",
        "learner.resume_state.every_steps=1",
    )
    run_dir = tmp_path / "two-learners"
    sets = [arg for o in overrides for arg in ("--set", o)]
    _kill_when_paused(_start([str(EXAMPLE), *sets], "after-log:2", tmp_path, _ray_head), run_dir)  # killed after row 2
    assert (run_dir / "logs" / "learner-1.log").exists()  # rank 1's actor ran
    assert _steps(run_dir) == [0, 1, 2] and _latest_step(run_dir) == 1

    resumed = _start(["--resume", str(run_dir)], None, tmp_path, _ray_head)
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output[-3000:]
    assert _steps(run_dir) == [0, 1, 2, 3]  # each step logged once: step 2 redone from step 1's state
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r[keys.LOSS]) and r[keys.BATCH_SIZE] == 4 for r in rows[1:-1])
    assert rows[-1]["final"] is True and _latest_step(run_dir) == 3
    assert (run_dir / "checkpoints" / "ckpt-3" / "model.safetensors").exists()  # rank 0 saved it


@pytest.mark.slow  # runs of unstable train
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_two_sharded_full_fine_tuning_learners_through_unstable_train_log_each_step_once_and_resume(
    tiny_model_dir, tmp_path, _ray_head
):
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "fsdp",
        "warm_start=null",
        "learner.policy.lora=null",
        "learner.num_learners=2",
        "learner.sharding=fsdp",
        "learner.num_steps=2",
        "learner.resume_state.every_steps=1",
    )
    run_dir = tmp_path / "fsdp"
    sets = [arg for o in overrides for arg in ("--set", o)]
    _kill_when_paused(_start([str(EXAMPLE), *sets], "after-log:2", tmp_path, _ray_head), run_dir)  # killed after row 2
    assert _steps(run_dir) == [0, 1, 2] and _latest_step(run_dir) == 1

    resumed = _start(["--resume", str(run_dir)], None, tmp_path, _ray_head)
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output[-3000:]
    assert _steps(run_dir) == [0, 1, 2]  # each step logged once: step 2 redone from step 1's sharded-and-gathered state
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r[keys.LOSS]) and r[keys.BATCH_SIZE] == 4 for r in rows[1:-1])
    assert rows[-1]["final"] is True and _latest_step(run_dir) == 2
    whole = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "ckpt-2")  # rank 0 gathered and saved it
    assert whole.num_parameters() == AutoModelForCausalLM.from_pretrained(tiny_model_dir).num_parameters()


@pytest.mark.slow  # runs of unstable train
def test_a_learner_rank_that_fails_stops_the_run_at_once_naming_it(tiny_model_dir, tmp_path, monkeypatch, _ray_head):
    """Rank 1 fails its first update while rank 0 waits for it in the gradients' all-reduce: the run stops with
    rank 1's error as its cause, exit status 1 (rank 0 waited for the collective timeout, 30 minutes, before)."""
    from unstable.runtime.learner_actors import FAIL_RANK_ENV

    overrides = tiny_run(tmp_path, tiny_model_dir, "failing-rank", "warm_start=null", "learner.num_learners=2")
    monkeypatch.setenv(FAIL_RANK_ENV, "1")
    run = _start([str(EXAMPLE), *[arg for o in overrides for arg in ("--set", o)]], None, tmp_path, _ray_head)
    output = run.communicate(timeout=300)[0].decode()  # a hang fails here
    assert run.returncode == 1, output[-3000:]
    assert "learner rank 1 failed" in output and FAIL_RANK_ENV in output, output[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "failing-rank" / "metrics.jsonl").read_text().splitlines()]
    assert "learner rank 1 failed" in rows[-1][keys.RUN_STOPPED]


class _ShardedHere(Exception):
    """Raised by `test_a_sharded_model_reaches_the_device_shard_by_shard` where the learner shards its model."""


def test_a_sharded_model_reaches_the_device_shard_by_shard(tiny_model_dir, monkeypatch):
    """With FSDP the learner hands the model to `shard_model` still on the host: FSDP moves each layer's shard to
    the device as it shards it, so no device ever holds the whole float32 model (before, `PolicyModel.load` moved it
    whole to the device first; here, with no GPU, that move to 'cuda' raised)."""
    cfg = _config(2, "reinforce", {}, "fsdp").model_copy(update={"num_gpus": 1.0})  # device: cuda
    learner = Learner.build(tiny_model_dir, cfg.algorithm.build(), cfg, rank=0)
    devices = set()

    def shard_model(root, model):
        devices.update(p.device.type for p in model.parameters())
        raise _ShardedHere

    monkeypatch.setattr(learner.parallel, "shard_model", shard_model)
    with pytest.raises(_ShardedHere):
        learner.initialize()
    assert devices == {"cpu"}
