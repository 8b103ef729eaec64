"""The original UnstableBaselines API: its actor classes, a thin adapter over the runtime's own.

`unstable.Tracker`, `StepBuffer`, `ModelPool`, `Collector` and `StandardLearner` are used as Ray actor classes
(`unstable.Tracker.options(name="Tracker").remote(run_name="demo", wandb_project="UB")`). Each is an `OriginalActor`
here: its `remote` translates the original API's keyword arguments into the component's settings section (a
`TrackerConfig`, `BufferConfig`, `PoolConfig`, ...) and starts the actor of `runtime.actors` that the YAML path's
builder (`runtime.topology`) starts with its config's section; this is the one place where those keywords are read.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from unstable.algorithms import Reinforce
from unstable.algorithms.base import BaseAlgo
from unstable.buffer.config import BufferConfig, RewardStages
from unstable.collector.config import CollectorConfig
from unstable.inference.config import InferenceConfig
from unstable.learner.config import LearnerConfig, LoraConfig, nest_flat_fields
from unstable.pool.config import PoolConfig
from unstable.runtime.actors import CollectorActor, ModelPoolActor, StepBufferActor, TrackerActor
from unstable.runtime.topology import await_inference_group, launch_inference_group, start_learner_group
from unstable.tracking import TrackerConfig, new_run_dir

log = logging.getLogger(__name__)


class OriginalActor:
    """One of the original API's actor classes: `options(**ray_options)` and `remote(*args, **keywords)` as on a
    Ray actor class. `remote` hands the Ray options and the original API's arguments to `start`, which translates
    them into the component's settings and starts the runtime's actor; it returns that actor's handle."""

    def __init__(self, start: Callable[..., Any], ray_options: dict[str, Any] | None = None):
        self._start = start
        self._ray_options = ray_options or {}

    def options(self, **ray_options: Any) -> OriginalActor:
        """This class with `ray_options` (`name`, `num_gpus`, ...) for the actor it starts."""
        return OriginalActor(self._start, self._ray_options | ray_options)

    def remote(self, *args: Any, **keywords: Any) -> Any:
        """Start the actor from the original API's arguments; returns its handle."""
        return self._start(self._ray_options, *args, **keywords)


def _tracker(ray_options: dict[str, Any], run_name: str = "run", wandb_project: str | None = None) -> Any:
    """The original API's `Tracker(run_name, wandb_project)`: the run directory `runs/run_name` (the next free `-2`,
    `-3`, ... when taken); W&B (in its 'auto' mode) only with `wandb_project`."""
    cfg = TrackerConfig(wandb="auto", wandb_project=wandb_project) if wandb_project else TrackerConfig(wandb="disabled")
    run_dir = new_run_dir(Path("runs") / run_name).resolve()
    return TrackerActor.options(**ray_options).remote(cfg, str(run_dir), run_name)


def _step_buffer(
    ray_options: dict[str, Any],
    max_buffer_size: int = BufferConfig.model_fields["max_buffer_size"].default,
    tracker=None,
    final_reward_transformation: Callable | None = None,
    step_reward_transformation: Callable | None = None,
    sampling_reward_transformation: Callable | None = None,
) -> Any:
    """The original API's `StepBuffer(max_buffer_size, tracker, final/step/sampling_reward_transformation)`: its
    transformations are the buffer's reward stages as given (a stage left out has none)."""
    stages = RewardStages(final_reward_transformation, step_reward_transformation, sampling_reward_transformation)
    cfg = BufferConfig(
        max_buffer_size=max_buffer_size,
        final_reward_transforms=[],
        step_reward_transforms=[],
        sampling_reward_transforms=[],
    )
    return StepBufferActor.options(**ray_options).remote(cfg, tracker, stages=stages)


def _model_pool(ray_options: dict[str, Any], tracker=None, **settings: Any) -> Any:
    """The original API's `ModelPool(sample_mode=..., max_active_lora=..., tracker=...)`: every `PoolConfig` field
    by keyword (its default when left out)."""
    return ModelPoolActor.options(**ray_options).remote(PoolConfig(**settings), tracker)


def _collector(
    ray_options: dict[str, Any],
    num_actors: int | None = None,
    step_buffer=None,
    model_pool=None,
    tracker=None,
    vllm_config: dict[str, Any] | None = None,
    *,
    evaluation_opponent: str | None = None,
    **settings: Any,
) -> Any:
    """The original API's `Collector(num_actors, step_buffer, model_pool, tracker, vllm_config, training_envs,
    evaluation_envs, evaluation_opponent)`: the `num_actors` inference servers of `vllm_config` are started first
    (`topology.launch_inference_group`, as the YAML path's builder starts its own, and `await_inference_group`), then
    the collector with them. Any other `CollectorConfig` field by keyword; envs as `(env_id, players, template)`; the
    one `evaluation_opponent` is the list of that opponent. An engine that does not start raises its ConfigError here,
    in the script."""
    if vllm_config is None:
        raise ValueError("Collector needs vllm_config")
    if evaluation_opponent is not None:
        settings["evaluation_opponents"] = [evaluation_opponent]
    cfg = CollectorConfig(**settings)
    model_path, inference = inference_from_vllm_config(vllm_config, num_actors)
    lora_rank = (vllm_config.get("lora_config") or {}).get("lora_rank")
    # the original API names its games in flight later, in `collect(num_workers)`: any number up to the bound
    group = await_inference_group(*launch_inference_group(inference, model_path, lora_rank=lora_rank))
    return CollectorActor.options(**ray_options).remote(cfg, group, step_buffer, model_pool, tracker)


def inference_from_vllm_config(
    vllm_config: dict[str, Any], num_actors: int | None = None
) -> tuple[str, InferenceConfig]:
    """The original API's `vllm_config` (and the Collector's `num_actors`, when given) as (model path,
    InferenceConfig): vLLM when it is installed, else the embedded transformers backend (said in a log line); a GPU
    per actor when the Ray cluster has GPUs. Keys: model_name, max_parallel_seq, max_tokens, max_loras, lora_config,
    max_model_len, and optionally any InferenceConfig field."""
    settings = dict(vllm_config)
    model = settings.pop("model_name")
    renamed = {"max_parallel_seq": "max_batch_size", "max_tokens": "max_new_tokens"}
    settings = {renamed.get(k, k): v for k, v in settings.items() if k != "lora_config"}
    if num_actors is not None:
        settings["num_actors"] = num_actors
    if "backend" not in settings:
        has_vllm = importlib.util.find_spec("vllm") is not None
        settings["backend"] = "vllm" if has_vllm else "transformers"
        why = "vLLM is installed" if has_vllm else "vLLM is not installed: the embedded transformers backend serves"
        log.warning("inference backend: %s (%s)", settings["backend"], why)
    if "num_gpus" not in settings:
        settings["num_gpus"] = 1.0 if ray.cluster_resources().get("GPU", 0) else 0.0
    return model, InferenceConfig(**settings)


def _standard_learner(
    ray_options: dict[str, Any],
    model_name: str,
    step_buffer,
    model_pool,
    tracker,
    algorithm: BaseAlgo | None = None,
    *,
    max_generation_len: int | None = None,
    **settings: Any,
) -> Any:
    """The original API's `StandardLearner(model_name, step_buffer, model_pool, tracker, algorithm, batch_size, ...)`:
    its keywords as a LearnerConfig (`learner_config_from_original_api`), its algorithm (default Reinforce) given
    `max_generation_len` (Dr. GRPO's constant) when it has none, started as the learner group
    (`topology.start_learner_group`, as the YAML path's builder starts its own). With `num_learners` > 1 every other
    rank gets rank 0's GPUs, anywhere. The inference actors (the script's Collector started them) load each
    checkpoint's folder."""
    cfg = learner_config_from_original_api(**settings)
    algorithm = algorithm or Reinforce()
    if max_generation_len is not None and getattr(algorithm, "max_generation_len", 0) is None:
        algorithm.max_generation_len = max_generation_len
    others = {"num_gpus": ray_options.get("num_gpus", cfg.num_gpus)}
    placements = [ray_options] + [others] * (cfg.num_learners - 1)
    return start_learner_group(cfg, model_name, step_buffer, model_pool, tracker, algorithm, placements=placements)


def learner_config_from_original_api(
    lora_cfg: dict[str, Any] | None = None,
    full_finetune: bool = False,
    activation_checkpointing: bool = False,
    **settings,
) -> LearnerConfig:
    """The original API's StandardLearner keywords as a LearnerConfig: `lora_cfg` is `policy.lora`, `full_finetune`
    is `policy.lora: null`, `activation_checkpointing` is `policy.gradient_checkpointing` (one switch in
    transformers); every other keyword (batch_size, mini_batch_size, learning_rate, grad_clip, max_train_len, ...)
    is the field of its name in LearnerConfig or in its `policy` or `optimizer` part. A keyword left out takes the
    default, as a field left out of `learner:` does."""
    if full_finetune:
        settings["lora"] = None
    elif lora_cfg is not None:
        settings["lora"] = LoraConfig(**lora_cfg)
    if activation_checkpointing:
        settings["gradient_checkpointing"] = True
    return LearnerConfig(**nest_flat_fields(settings))  # its policy's and optimizer's fields go to their sections


Tracker = OriginalActor(_tracker)
StepBuffer = OriginalActor(_step_buffer)
ModelPool = OriginalActor(_model_pool)
Collector = OriginalActor(_collector)
StandardLearner = OriginalActor(_standard_learner)
