"""The whole loop through Ray: collector, buffer, pool, inference actor and learner run concurrently."""

import json

import pytest
import yaml

from unstable.config import load_config
from unstable.runtime import topology, train
from unstable.tracking import keys, new_run_dir
from unstable.tracking.history import LATEST_TABLES_FILE

from .runs import EXAMPLE, tiny_run

pytestmark = pytest.mark.slow  # Ray


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_two_a2c_learner_steps_through_ray_from_a_warm_start_with_an_old_configs_buffer_discount(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Full fine-tuning after a tiny warm start, A2C with a bootstrapped critic, top_p 0.5, every sink the demo writes.
    The config is one from before the discount became a reward transform (`buffer.discount`): the run's saved config,
    which `--resume` reads back, holds the discount as the first step transform. The learner's process starts while
    the inference engines start, not after them."""
    calls = []
    for name in ("start_learner_group", "await_inference_group"):
        original = getattr(topology, name)
        monkeypatch.setattr(topology, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "ray-smoke",
        "learner.num_steps=2",
        "learner.batch_size=8",
        "collector.num_workers=4",
        "collector.num_eval_workers=1",
        "inference.max_new_tokens=8",
        "evaluation.games_at_start=4",
        "evaluation.games_at_end=4",
        "tracker.tensorboard=true",  # every sink the demo writes
        "warm_start.games=2",  # the example's warm start, tiny: a few supervised updates of every weight
        "warm_start.epochs=1",
        "inference.top_p=0.5",  # the learner scores each token under the nucleus it was sampled from
        "buffer.discount=0.5",
        "learner.algorithm.name=a2c",
        "learner.algorithm.args={bootstrap: 0.5}",
    )
    rows = []
    summary = train(load_config(EXAMPLE, overrides), on_row=rows.append)
    assert summary.learner_steps == 2 and summary.train_games >= 1
    assert summary.eval_start["games"] + summary.eval_start["failed"] == 4
    assert [r["learner/step"] for r in rows] == [0, 1, 2]
    assert rows[1][keys.RATIO_MEAN] == pytest.approx(1.0, abs=0.01)  # the first update's batch is on-policy
    assert sum(r["inference/generated_tokens"] for r in rows[1:]) > 0  # per window: a short one may see none
    run_dir = tmp_path / "ray-smoke"
    assert summary.warm_start_checkpoint.startswith(str(run_dir / "warm-start" / "checkpoints"))
    assert (run_dir / "checkpoints" / "ckpt-2" / "model.safetensors").exists()  # full fine-tuning: whole models
    logs = {p.name for p in (run_dir / "logs").iterdir()}  # one log file per component
    assert logs == {f"{c}.log" for c in ("tracker", "step_buffer", "model_pool", "collector", "learner")}
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["final"] is True and "eval_end" in lines[-1]
    # every metric reaches the file: inference throughput, buffer, pool ratings, the algorithm's losses
    assert lines[1:3] == rows[1:]
    step = lines[2]
    assert max(r[keys.INFERENCE_TOKENS_PER_S] for r in lines[1:3]) > 0
    assert step[keys.BUFFER_SIZE] >= 0 and keys.LOSS in step and keys.VALUE_LOSS in step
    ladder = json.loads((run_dir / LATEST_TABLES_FILE).read_text())[keys.POOL_LADDER]  # tables: their own file
    assert step[keys.POOL_CHECKPOINTS] == 3 and {e["agent"] for e in ladder} >= {"ckpt--1"}
    buffer = yaml.safe_load((run_dir / "config.yaml").read_text())["buffer"]
    assert "discount" not in buffer
    discount, penalty = buffer["step_reward_transforms"]  # the example's own PenaltyForInvalidMove comes second
    assert discount == {"name": "DiscountLaterDecisions", "args": {"discount": 0.5}}
    assert penalty["name"] == "PenaltyForInvalidMove"
    assert calls == ["start_learner_group", "await_inference_group"]


def test_a_new_run_never_writes_into_an_earlier_runs_directory(tmp_path):
    path = tmp_path / "run"
    assert new_run_dir(path) == path  # not there yet
    path.mkdir()
    assert new_run_dir(path) == path  # empty
    (path / "metrics.jsonl").write_text("{}\n")
    assert new_run_dir(path) == tmp_path / "run-2"
    (tmp_path / "run-2").mkdir()
    (tmp_path / "run-2" / "config.yaml").write_text("")
    assert new_run_dir(path) == tmp_path / "run-3"


def test_two_inference_actors_sample_different_completions_for_one_prompt(tiny_model_dir, shared_ray):
    import ray

    from unstable.inference import InferenceConfig
    from unstable.records import GenerationRequest
    from unstable.runtime.topology import await_inference_group, launch_inference_group

    ray.init(address=shared_ray)
    try:
        inference = InferenceConfig(num_actors=2, max_new_tokens=16)
        servers = await_inference_group(*launch_inference_group(inference, tiny_model_dir)).servers
        request = GenerationRequest("<|im_start|>user\nYour move.<|im_end|>\n<|im_start|>assistant\n")
        first, second = ray.get([server.generate.remote(request) for server in servers])
        assert first.completion_token_ids != second.completion_token_ids  # each actor samples its own stream
    finally:
        ray.shutdown()


def test_inference_actors_needing_more_gpus_than_the_cluster_has_are_refused_in_one_line():
    """The driver starts the inference group (the collector did, where the refusal became a Ray traceback)."""
    import ray

    from unstable.config import ConfigError
    from unstable.inference import InferenceConfig
    from unstable.runtime.topology import launch_inference_group

    ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, ignore_reinit_error=True)
    try:
        with pytest.raises(ConfigError, match=r"inference.num_actors = 2 x inference.num_gpus = 1.0: 2.0 GPUs, but"):
            launch_inference_group(InferenceConfig(num_actors=2, num_gpus=1), "org/model")
    finally:
        ray.shutdown()
