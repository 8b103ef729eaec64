"""A run on a Ray cluster of two nodes, simulated on one machine with `ray.cluster_utils.Cluster`: the inference
actor on the second node (`inference.resources`), everything that writes the run directory on the driver's node.
The machine's one filesystem is still shared by both nodes, so the test checks that the remote actor got every
checkpoint through Ray's object store into its own cache (counted in `inference/checkpoints_fetched`) instead of
reading the run directory's path, with `learner.weight_handover: folder`; then the run resumes on the same cluster
with the weights handed over in memory, and the remote actor serves the new policy."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from unstable.config import ConfigError, load_config
from unstable.runtime import resume_training, train
from unstable.tracking import keys

from .ray_worker_launcher import NODE_ARGS
from .runs import EXAMPLE, tiny_run

pytestmark = pytest.mark.slow  # a Ray cluster and two sessions of a run


@pytest.fixture(scope="module")
def two_node_cluster():
    """A Ray cluster of two nodes on this machine: the head (the driver's node, with one pretend GPU) and a node
    with the custom resource `node2` and one pretend GPU, joined through RAY_ADDRESS as `unstable train` joins one.
    Its address file goes to a temporary directory of its own (RAY_TMPDIR), so no other `ray.init()` on the machine
    joins it. Its workers start through tests/ray_worker_launcher.py without a zygote: the launcher's exec path."""
    from ray.cluster_utils import Cluster

    saved = {name: os.environ.get(name) for name in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths live in it
    try:
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False, **NODE_ARGS}
        )
        try:
            cluster.add_node(num_cpus=1, num_gpus=1, resources={"node2": 1}, **NODE_ARGS)
            cluster.wait_for_nodes()
            os.environ["RAY_ADDRESS"] = cluster.address
            yield cluster
        finally:
            cluster.shutdown()
    finally:
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _fetched(rows: list[dict]) -> int:
    return sum(r.get(keys.INFERENCE_CHECKPOINTS_FETCHED, 0) for r in rows)


@pytest.mark.long  # a minute or more of runs: scheduled first
def test_a_run_on_two_nodes_ships_checkpoints_to_the_inference_node_and_resumes(
    two_node_cluster, tiny_model_dir, tmp_path
):
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "two-nodes",
        "learner.num_steps=1",
        "learner.policy.lora={lora_rank: 4, lora_alpha: 8}",  # adapters: what most runs ship
        "learner.resume_state.every_steps=1",
        "warm_start=null",
        "inference.resources={node2: 1}",  # the inference actor on the second node, nothing else there
        "evaluation.games_at_end=2",  # the final evaluation plays the newest checkpoint: one fetch at least
    )
    summary = train(load_config(EXAMPLE, [*overrides, "learner.weight_handover=folder"]))
    run_dir = tmp_path / "two-nodes"
    assert summary.learner_steps == 1 and summary.stopped is None
    first = _rows(run_dir)
    assert _fetched(first) >= 1  # the learner's checkpoints went through the object store into the node's cache
    logs = {p.name for p in (run_dir / "logs").iterdir()}  # every writer of the run directory wrote it
    assert logs == {f"{c}.log" for c in ("tracker", "step_buffer", "model_pool", "collector", "learner")}
    assert (run_dir / "checkpoints" / "ckpt-1" / "adapter_config.json").exists()

    resumed = resume_training(run_dir, ["learner.num_steps=2", "learner.weight_handover=memory"])
    assert resumed.learner_steps == 2 and resumed.stopped is None
    rows = _rows(run_dir)
    steps = [r.get(keys.STEP) for r in rows]
    assert [s for s in steps if s is not None] == [0, 1, 2]
    assert _fetched(rows[steps.index(1) + 1 :]) >= 1  # the resumed session fetched its restored checkpoint afresh
    served = [v for r in rows for v in r.get(keys.INFERENCE_POLICY_VERSION_BY_ACTOR, [])]
    assert max(served) == 2  # ckpt-2, handed over in memory to the actor on the other node


def test_learner_ranks_and_inference_nodes_are_placed_by_their_resources(two_node_cluster):
    """One test, so the two-node cluster is started once for both kinds of check: the learner with its GPUs sits on
    the driver's node; inference nodes need the model; two GPU ranks are reserved together, rank 0 on the driver's
    node, and three that do not fit are refused."""
    import ray

    from unstable.runtime.topology import _check_model_on, _other_nodes, learner_placements

    ray.init(address=two_node_cluster.address)
    try:
        driver_node = ray.get_runtime_context().get_node_id()
        second_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != driver_node)

        @ray.remote(num_cpus=0)
        class Probe:
            def where(self) -> tuple[str, int]:
                return ray.get_runtime_context().get_node_id(), len(ray.get_gpu_ids())

        one_rank = ["learner.num_learners=1"]
        (options,) = learner_placements(load_config(EXAMPLE, [*one_rank, "learner.num_gpus=1"]).learner, driver_node)
        learner = Probe.options(**options).remote()
        assert ray.get(learner.where.remote(), timeout=120) == (driver_node, 1)
        ray.kill(learner)
        ray.util.remove_placement_group(options["scheduling_strategy"].placement_group)  # its GPU is rank 0's below
        with pytest.raises(ConfigError, match="learner.num_gpus = 2.0: the learner runs on the driver's node"):
            learner_placements(load_config(EXAMPLE, [*one_rank, "learner.num_gpus=2"]).learner, driver_node)
        others = _other_nodes(load_config(EXAMPLE, ["inference.resources={node2: 1}"]), driver_node)
        assert [n["Resources"].get("node2") for n in others] == [1.0]
        with pytest.raises(ConfigError, match=r"model.path = '/no/such/model': no such model directory .* on Ray node"):
            _check_model_on(others, "/no/such/model")  # by a task on the second node

        two = load_config(EXAMPLE, ["learner.num_gpus=1", "learner.num_learners=2"])
        rank_0, rank_1 = (Probe.options(**options).remote() for options in learner_placements(two.learner, driver_node))
        assert ray.get(rank_0.where.remote(), timeout=120) == (driver_node, 1)
        assert ray.get(rank_1.where.remote(), timeout=120) == (second_node, 1)  # the head's one GPU is rank 0's
        three = load_config(EXAMPLE, ["learner.num_gpus=1", "learner.num_learners=3", "learner.batch_size=6"])
        with pytest.raises(ConfigError, match="learner.num_learners = 3 with learner.num_gpus = 1.0 each: the Ray"):
            learner_placements(three.learner, driver_node)
    finally:
        ray.shutdown()
