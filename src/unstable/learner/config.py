"""The learner's settings: batching, optimisation, the policy model's shape (LoRA or full) and the algorithm."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from unstable.settings import MAX_THREADS, Settings, check_registered


class LoraConfig(Settings):
    """LoRA adapter shape (the original API's `lora_cfg` keys)."""

    lora_rank: int = Field(16, ge=1, description="rank r of each adapter")
    lora_alpha: float = Field(32, gt=0, description="the update is scaled by lora_alpha / lora_rank")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the modules that get an adapter",
    )


class AlgorithmConfig(Settings):
    """The learning algorithm by registry name (`unstable.algorithms.ALGORITHMS`) and its keyword arguments."""

    name: str = Field("reinforce", description="one of `unstable.algorithms.ALGORITHMS`")
    args: dict[str, Any] = Field({}, description="keyword arguments of its constructor")

    @field_validator("name")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        from unstable.algorithms import ALGORITHMS

        return check_registered(value, ALGORITHMS, "algorithm")

    @model_validator(mode="after")
    def _args_fit(self) -> AlgorithmConfig:
        try:
            self.build()  # cheap: heads and optimizers are made in `initialize`
        except TypeError as exc:
            raise ValueError(f"args {self.args} do not fit algorithm {self.name!r}: {exc}") from None
        return self

    def build(self):
        """A fresh instance of the configured algorithm."""
        from unstable.algorithms import ALGORITHMS

        return ALGORITHMS[self.name](**self.args)


class RetentionConfig(Settings):
    """Which learner steps keep their checkpoint; the pool's active checkpoints (in play as opponents) and those a
    kept resume state's pool names are always kept."""

    keep_last: int | None = Field(
        5, ge=1, description="the newest steps kept (None: keep every step, a disk cost that grows with the run)"
    )
    keep_every: int | None = Field(None, ge=1, description="also keep every step divisible by this")
    keep_steps: list[int] = Field([], description="also keep these steps")

    def keeps(self, step: int, latest: int) -> bool:
        """Whether `step` is kept when `latest` is the newest saved step."""
        return (
            self.keep_last is None
            or step > latest - self.keep_last
            or (self.keep_every is not None and step % self.keep_every == 0)
            or step in self.keep_steps
        )


class ResumeStateConfig(Settings):
    """When the learner saves its resume state (`state/step-<k>/`) and how many it keeps: a state is due
    `every_steps` steps or `every_minutes` minutes after the previous one, whichever comes first, and always at
    the run's last step; with both None, only there."""

    every_steps: int | None = Field(10, ge=1, description="save the state every this many learner steps")
    every_minutes: float | None = Field(
        10.0, gt=0.0, description="save the state when this many minutes passed since the previous save"
    )
    keep_last: int = Field(2, ge=1, description="the newest saved states kept on disk (older ones are deleted)")

    def due(self, step: int, last_step: int, minutes_since_save: float) -> bool:
        """Whether learner step `step` saves its state, `minutes_since_save` after the previous save."""
        return (
            step >= last_step
            or (self.every_steps is not None and step % self.every_steps == 0)
            or (self.every_minutes is not None and minutes_since_save >= self.every_minutes)
        )


class WarmStartConfig(Settings):
    """Supervised warm start before RL: imitate scripted agents' moves in the first training env
    (`collector.demonstrations.generate_sft_steps` + `learner.sft.run_sft`, the learner's LoRA shape or, with
    `learner.policy.lora: null`, every weight); RL then starts from the resulting checkpoint."""

    agents: list[str] = Field(["random", "random"], description="scripted agent per seat, rotated each game")
    games: int = Field(
        800,
        ge=1,
        le=100_000,
        description="games whose valid moves become supervised steps (at most 100,000: every move is held in memory)",
    )
    epochs: int = Field(2, ge=1, description="shuffled passes over the moves")
    batch_size: int = Field(16, ge=1, description="moves per SFT update")
    learning_rate: float = Field(1e-3, gt=0.0, description="the SFT updates' learning rate")

    @field_validator("agents")
    @classmethod
    def _scripted_agents(cls, value: list[str]) -> list[str]:
        from unstable.agents.scripted import make_scripted_agent

        for name in value:
            make_scripted_agent(name, seed=0)  # an unknown name raises, listing the known ones
        return value


class PolicyConfig(Settings):
    """What loading, scoring and training the policy model needs; evaluation and SFT read only this part.

    The trained model's shape (`lora: null` trains every weight) and how its forward and backward passes run."""

    lora: LoraConfig | None = Field(LoraConfig(), description="train a LoRA adapter (null: every weight)")
    initial_lora_path: str | None = Field(
        None, description="start from this LoRA adapter, also the KL reference (a full model is `model.path`)"
    )
    micro_batch_tokens: int = Field(8192, ge=1, description="padded tokens per micro-batch")
    mini_batch_size: int | None = Field(None, ge=1, description="most rows in one micro-batch (None: no limit)")
    max_train_len: int | None = Field(None, ge=2, description="train on the first tokens of longer sequences")
    logit_chunk_tokens: int = Field(
        4096, ge=1, description="completion tokens whose vocabulary logits are materialised at once"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (less memory)")
    autocast_dtype: Literal["bfloat16"] | None = Field(
        None,
        description="run forward passes under torch.autocast in this dtype (None: bf16 for a bfloat16 model, else "
        "none); never float16, whose gradients underflow without loss scaling, which the learner does not do",
    )
    layout: Literal["shared-prompts", "padded", "packed"] = Field(
        "shared-prompts",
        description="how the decoder runs over a micro-batch, each the same log-probs: 'shared-prompts' runs the "
        "prefix every row shares once, each distinct prompt once, and each row's completion from its last prompt "
        "token on (vines and groups repeat a prompt; the rules open every prompt), or as 'padded' with "
        "gradient_checkpointing or sharding fsdp; 'padded' runs every row whole; "
        "'packed' runs the real tokens in one row, position ids restarting per sequence (pays with a varlen "
        "attention kernel, flash_attention_2 on GPU)",
    )

    @field_validator("initial_lora_path")
    @classmethod
    def _start_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_dir():
            raise ValueError("no such checkpoint directory")
        return value

    @model_validator(mode="after")
    def _initial_adapter_needs_lora(self) -> PolicyConfig:
        if self.initial_lora_path is not None and self.lora is None:
            raise ValueError(
                f"initial_lora_path {self.initial_lora_path!r} with lora: null: full fine-tuning trains no adapter; "
                "start it from a full model with model.path (merge the adapter into its base model first), or set "
                "learner.policy.lora to train the adapter"
            )
        return self

    @property
    def checkpoint_kind(self) -> str:
        """'lora' for adapter checkpoints, 'full' for whole models."""
        return "lora" if self.lora is not None else "full"


class OptimizerConfig(Settings):
    """AdamW's learning rate and its schedule, the gradient clip, and how many non-finite updates are skipped."""

    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW's peak learning rate")
    lr_schedule: str = Field(
        "constant", description="learning-rate schedule over num_steps (learner.schedule.LR_SCHEDULES)"
    )
    warmup_steps: int = Field(0, ge=0, description="updates of linear warm-up before the schedule")
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="the decaying schedules end at this share of learning_rate"
    )
    grad_clip: float = Field(1.0, gt=0.0, description="clip_grad_norm_ threshold")
    max_skipped_updates: int = Field(
        3, ge=0, description="optimizer steps in a row skipped for a non-finite gradient before the run stops"
    )

    @field_validator("lr_schedule")
    @classmethod
    def _known_schedule(cls, value: str) -> str:
        from unstable.learner.schedule import LR_SCHEDULES

        return check_registered(value, LR_SCHEDULES, "lr_schedule")


# The sections of `learner:` whose fields the original API's StandardLearner keywords, and run configs written
# before the split, give flat under `learner:` (`learning_rate` for `optimizer.learning_rate`): its adapter and the
# resume of such a run move them (`nest_flat_fields`); a run config names each in its section only.
NESTED_SECTIONS = {"policy": PolicyConfig, "optimizer": OptimizerConfig}


class LearnerConfig(Settings):
    """The learning loop (steps, batch, staleness, kept files, algorithm), its `policy` and its `optimizer`.

    A field of `policy` or `optimizer` belongs in its section: written flat under `learner:` it is refused, naming
    the section (the original API's keywords and old run directories are moved there by `nest_flat_fields`)."""

    num_steps: int = Field(10, ge=1, description="learner updates in a run")
    batch_size: int = Field(32, ge=1, description="steps per update")
    max_staleness: int | None = Field(
        None, ge=0, description="drop samples from policies more than this many updates old (None: keep all)"
    )
    num_threads: int | None = Field(
        1, ge=1, le=MAX_THREADS, description="torch threads of the learner process (None: torch's choice)"
    )
    num_gpus: float = Field(
        0.0, ge=0.0, description="GPUs of each learner actor (of each rank); > 0 puts the model on cuda"
    )
    num_learners: int = Field(
        1,
        ge=1,
        description="data-parallel learner actors in one torch.distributed group (gloo on the CPU, NCCL on GPUs): "
        "each trains on batch_size / num_learners steps of every batch, gradients averaged; rank 0 runs the loop "
        "(batches, checkpoints, rows, resume state). With max_staleness, the fresh steps of a batch are cut to a "
        "multiple of num_learners",
    )
    sharding: Literal["none", "fsdp"] = Field(
        "none",
        description="'fsdp' shards the model's parameters, gradients and optimizer state over the num_learners "
        "ranks with PyTorch FSDP2 (full fine-tuning only, learner.policy.lora: null; needs num_learners > 1), so "
        "each rank holds about 1/num_learners of them; 'none': every rank holds the whole model",
    )
    poll_interval_s: float = Field(0.05, gt=0.0, description="how often the loop asks the buffer for a batch")
    stall_timeout_s: float | None = Field(
        None,
        gt=0,
        description="stop the run, saying what each part was doing, when the learner makes no step for this long "
        "(None: 10 minutes, or 20x the slowest step so far when that is longer)",
    )
    weight_handover: Literal["memory", "folder"] = Field(
        "memory",
        description="how each new policy reaches the inference actors: `memory` (its tensors through Ray's object "
        "store; the checkpoint folder is written in the background) or `folder` (written first, then loaded; so "
        "too for an engine that cannot take tensors, such as vLLM with a LoRA adapter, and for a sharded learner)",
    )
    policy: PolicyConfig = PolicyConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    retention: RetentionConfig = RetentionConfig()
    resume_state: ResumeStateConfig = ResumeStateConfig()
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)

    @model_validator(mode="before")
    @classmethod
    def _each_field_in_its_section(cls, data: Any) -> Any:
        for section, model in NESTED_SECTIONS.items():
            flat = sorted(set(model.model_fields) & set(data if isinstance(data, dict) else ()))
            if flat:
                raise ValueError(f"{flat[0]} belongs in learner.{section} (learner.{section}.{flat[0]})")
        return data

    @model_validator(mode="after")
    def _mini_batch_fits(self) -> LearnerConfig:
        size = self.policy.mini_batch_size
        if size is not None and size > self.batch_size:
            raise ValueError(
                f"policy.mini_batch_size {size} is larger than batch_size {self.batch_size}: "
                "a mini-batch is a part of a batch"
            )
        return self

    @model_validator(mode="after")
    def _shards_equal(self) -> LearnerConfig:
        if self.batch_size % self.num_learners:
            raise ValueError(
                f"batch_size {self.batch_size} does not split into {self.num_learners} equal shards "
                f"(num_learners {self.num_learners}): make it a multiple"
            )
        self.algorithm.build().check_num_learners(self.num_learners)
        return self

    @model_validator(mode="after")
    def _a_gpu_per_rank(self) -> LearnerConfig:
        if self.num_learners > 1 and 0 < self.num_gpus < 1:
            raise ValueError(
                f"num_gpus {self.num_gpus} with num_learners {self.num_learners}: Ray would put several ranks on one "
                "GPU, where NCCL refuses to run them; give each rank a whole GPU (num_gpus: 1)"
            )
        return self

    @model_validator(mode="after")
    def _sharding_fits(self) -> LearnerConfig:
        if self.sharding == "none":
            return self
        if self.policy.lora is not None:
            raise ValueError(
                "sharding fsdp with a LoRA adapter: it shards full fine-tuning only; set learner.policy.lora: null "
                "or learner.sharding: none"
            )
        if self.num_learners < 2:
            raise ValueError(
                f"sharding fsdp with num_learners {self.num_learners}: there is nothing to shard over; "
                "set learner.num_learners to 2 or more, or learner.sharding: none"
            )
        self.algorithm.build().check_sharding()
        return self

    @property
    def device(self) -> str:
        """Where the model trains: `cuda` when the learner is given GPUs, else `cpu`."""
        return "cuda" if self.num_gpus else "cpu"


def nest_flat_fields(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` (a `learner:` section's data or keywords) with each field of a `NESTED_SECTIONS` section written
    flat moved into its section; a field given both ways is an error naming both."""
    nested = dict(settings)
    for section, model in NESTED_SECTIONS.items():
        flat = {name: nested.pop(name) for name in model.model_fields if name in nested}
        if not flat:
            continue
        inner = nested.get(section, {})
        inner = inner.model_dump(exclude_unset=True) if isinstance(inner, Settings) else dict(inner or {})
        both = sorted(set(flat) & set(inner))
        if both:
            raise ValueError(f"{both[0]} is given both as learner.{both[0]} and learner.{section}.{both[0]}")
        nested[section] = inner | flat
    return nested
