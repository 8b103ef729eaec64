"""The run configuration: one pydantic model per component, nested in `RunConfig`, validated on load.

Every error names the field path, the value and what is allowed (unknown keys are errors too, so a typo
cannot silently fall back to a default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from unstable.records import EnvSpec


def _registered(value: str, registry: dict, what: str) -> str:
    """`value` if it names an entry of `registry`, else a ValueError listing the valid names."""
    if value not in registry:
        raise ValueError(f"unknown {what} {value!r}; valid: {sorted(registry)}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSpecConfig(_Strict):
    """One game: TextArena env id, player count, prompt template. YAML may also give `[id, players, template]`."""

    env_id: str
    num_players: int = Field(2, ge=1)
    prompt_template: str = "qwen3-zs"

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            keys = ("env_id", "num_players", "prompt_template")
            return dict(zip(keys, value))
        return value

    @field_validator("env_id")
    @classmethod
    def _known_env(cls, value: str) -> str:
        from unstable.games.registry import validate_env_id

        return validate_env_id(value)

    @field_validator("prompt_template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        from unstable.games.templates import get_template

        get_template(value)
        return value

    def to_spec(self) -> EnvSpec:
        """The record the games code uses."""
        return EnvSpec(self.env_id, self.num_players, self.prompt_template)


class RunSection(_Strict):
    """Where the run lives and how it is seeded."""

    name: str = "run"
    dir: str = "runs"
    seed: int = 0
    num_cpus: int | None = Field(None, ge=1, description="CPUs Ray may use (None: all)")

    @property
    def path(self) -> Path:
        """The run directory, `dir/name`."""
        return Path(self.dir) / self.name


class ModelConfig(_Strict):
    """The base model: a local directory or hub id; `build_tiny_if_missing` builds the tiny test model there."""

    path: str
    build_tiny_if_missing: bool = False
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class InferenceConfig(_Strict):
    """The inference engine and its sampling settings."""

    backend: Literal["transformers", "vllm"] = "transformers"
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_batch_size: int = Field(64, ge=1)
    batch_wait_ms: float = Field(5.0, ge=0.0)
    max_loras: int = Field(4, ge=1)
    max_model_len: int = Field(4096, ge=16)
    num_threads: int | None = Field(1, ge=1, description="torch threads of the inference process")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs of each inference actor")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    num_actors: int = Field(1, ge=1, description="inference server actors; the collector spreads requests over them")


class CollectorConfig(_Strict):
    """How many games run at once, which games, and the evaluation opponent."""

    num_workers: int = Field(8, ge=1)
    num_eval_workers: int = Field(0, ge=0)
    max_turns: int = Field(60, ge=1)
    training_envs: list[EnvSpecConfig]
    evaluation_envs: list[EnvSpecConfig] = []
    evaluation_opponent: str = "random"
    group_size: int = Field(
        1, ge=1, description="continuations per training game branched from a copied decision state (1: off)"
    )

    @field_validator("evaluation_opponent")
    @classmethod
    def _known_opponent(cls, value: str) -> str:
        from unstable.agents.scripted import make_scripted_agent

        make_scripted_agent(value, seed=0)
        return value


class PoolConfig(_Strict):
    """Opponent sampling and ratings."""

    sample_mode: Literal["mirror", "fixed", "random", "lagged"] = "mirror"
    fixed_opponents: list[str] = []
    max_active_lora: int = Field(3, ge=1)
    rating_backend: Literal["openskill", "trueskill"] = "openskill"

    @field_validator("fixed_opponents")
    @classmethod
    def _known_opponents(cls, value: list[str]) -> list[str]:
        from unstable.agents.scripted import make_scripted_agent

        for name in value:
            make_scripted_agent(name, seed=0)
        return value

    @model_validator(mode="after")
    def _fixed_needs_opponents(self) -> PoolConfig:
        if self.sample_mode == "fixed" and not self.fixed_opponents:
            raise ValueError("sample_mode 'fixed' needs at least one entry in fixed_opponents")
        return self


class TransformConfig(_Strict):
    """A reward transform by class name with its keyword arguments."""

    name: str
    args: dict[str, Any] = {}

    @field_validator("name")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        from unstable.rewards import TRANSFORMS

        return _registered(value, TRANSFORMS, "reward transform")


class BufferConfig(_Strict):
    """StepBuffer size and the three reward-transform stages."""

    max_buffer_size: int = Field(768, ge=1)
    final_reward_transforms: list[TransformConfig] = [TransformConfig(name="WinDrawLossFormatter")]
    step_reward_transforms: list[TransformConfig] = []
    sampling_reward_transforms: list[TransformConfig] = []


class AlgorithmConfig(_Strict):
    """The learning algorithm by name and its keyword arguments."""

    name: str = "reinforce"
    args: dict[str, Any] = {}

    @field_validator("name")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        from unstable.algorithms import ALGORITHMS

        return _registered(value, ALGORITHMS, "algorithm")


class LoraConfigModel(_Strict):
    """LoRA adapter shape (the seed's `lora_cfg` keys)."""

    lora_rank: int = Field(16, ge=1)
    lora_alpha: float = Field(32, gt=0)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LearnerConfig(_Strict):
    """Batching, optimisation and checkpointing of the learner."""

    num_steps: int = Field(10, ge=1)
    batch_size: int = Field(32, ge=1)
    mini_batch_size: int | None = Field(None, ge=1)
    micro_batch_tokens: int = Field(8192, ge=1)
    learning_rate: float = Field(1e-5, gt=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    max_train_len: int | None = Field(None, ge=2)
    lora: LoraConfigModel | None = LoraConfigModel()
    initial_lora_path: str | None = None
    num_threads: int | None = Field(1, ge=1)
    num_gpus: float = Field(0.0, ge=0.0)
    max_staleness: int | None = Field(
        None, ge=0, description="drop samples from policies more than this many updates old (None: keep all)"
    )
    algorithm: AlgorithmConfig = AlgorithmConfig()


class EvaluationConfig(_Strict):
    """Blocking evaluation before and after training (learner vs the eval opponent, seats alternated)."""

    games_at_start: int = Field(20, ge=0)
    games_at_end: int = Field(20, ge=0)


class RunConfig(_Strict):
    """A whole training run."""

    run: RunSection = RunSection()
    model: ModelConfig
    inference: InferenceConfig = InferenceConfig()
    collector: CollectorConfig
    pool: PoolConfig = PoolConfig()
    buffer: BufferConfig = BufferConfig()
    learner: LearnerConfig = LearnerConfig()
    evaluation: EvaluationConfig = EvaluationConfig()


class ConfigError(ValueError):
    """A config file that does not validate; the message lists every bad field with its value."""


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML, apply `key.path=value` overrides, validate. Raises ConfigError naming each bad field."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    for override in overrides or []:
        _apply_override(data, override)
    return validate_config(data, source=str(path))


def validate_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a config dict; errors name the field path, the given value and the rule."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"invalid config {source}:"]
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {field} = {err.get('input')!r}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form key.path=value")
    key, raw = override.split("=", 1)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = yaml.safe_load(raw)
