"""The run configuration: each component's own settings model, nested in `RunConfig`, validated on load.

Every component declares its settings once, in its own folder (`collector/config.py`, `pool/config.py`,
`buffer/config.py`, `inference/config.py`, `learner/config.py`, `tracking/config.py`), and takes that section
whole. This module adds the run-level sections and reads YAML. Every error names the field path, the value and
what is allowed (unknown keys are errors too, so a typo cannot silently fall back to a default).
"""

from __future__ import annotations

import json
import logging
from functools import reduce
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from unstable.agents.seating import parse_opponent
from unstable.buffer.config import BufferConfig
from unstable.collector.config import CollectorConfig
from unstable.inference.config import InferenceConfig
from unstable.learner.config import LearnerConfig, WarmStartConfig, nest_flat_fields
from unstable.models.tiny import TinyShape, check_tiny_shape
from unstable.pool.config import PoolConfig
from unstable.settings import Settings
from unstable.tracking.config import TrackerConfig

log = logging.getLogger(__name__)


class RunSection(Settings):
    """Where the run lives and how it is seeded."""

    name: str = Field("run", description="the run directory's name under `dir` (taken: `NAME-2`, `NAME-3`, ...)")
    dir: str = Field("runs", description="the folder that holds run directories")
    seed: int = Field(0, description="seeds the warm start, the games and the inference actors' sampling")
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs Ray may use (None: all); unset when joining a Ray cluster (`RAY_ADDRESS`)"
    )
    shared_storage: bool = Field(
        False,
        description="every node of the Ray cluster sees `dir` at the same path (a shared filesystem): inference actors "
        "on other nodes read checkpoints there; false: they get them through Ray's object store",
    )

    @property
    def path(self) -> Path:
        """The run directory, `dir/name`."""
        return Path(self.dir) / self.name


# Any one of these names a tokenizer transformers can load (tokenizer_config.json: its class says which files).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tokenizer_config.json",
)


def check_model_path(value: str, build_tiny: bool = False) -> str:
    """`value` if it can name a model: a hub id, or a directory whose config.json parses as a JSON object beside a
    tokenizer file (a directory for the tiny model to be built in, with `build_tiny`). A path that can only be
    local (it starts with '/', '.' or '~', or has more than one '/') must exist. Else a ValueError saying what
    is wrong, found without loading anything, so a run is refused before it creates its directory."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError("a file, not a model directory")
    if not path.is_dir():
        if not build_tiny and (value.startswith(("/", ".", "~")) or value.count("/") > 1):
            raise ValueError("no such model directory (and not a hub id 'org/name')")
        return value
    config = path / "config.json"
    if not config.is_file():
        if build_tiny:
            return value
        raise ValueError("no config.json in the model directory")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError("its config.json is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"its config.json is not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(f"its config.json holds a {type(parsed).__name__}, not a JSON object")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"no tokenizer in the model directory (none of {', '.join(TOKENIZER_FILES)})")
    return value


class ModelConfig(Settings):
    """The base model: a local directory or hub id; `build_tiny_if_missing` builds the tiny test model there, of
    `tiny_shape`."""

    build_tiny_if_missing: bool = Field(False, description="build the tiny test model at `path` if it is not there")
    path: str = Field(description="a local model directory or a hub id 'org/name'")
    tiny_shape: TinyShape = Field(
        TinyShape(), description="the size of the tiny model built at `path` (with build_tiny_if_missing)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the inference engines and of a frozen LoRA base (trained weights stay float32)"
    )

    @field_validator("path")
    @classmethod
    def _loadable(cls, value: str, info: ValidationInfo) -> str:
        return check_model_path(value, build_tiny=bool(info.data.get("build_tiny_if_missing")))

    @model_validator(mode="after")
    def _tiny_of_its_shape(self) -> ModelConfig:
        if self.build_tiny_if_missing and Path(self.path).expanduser().is_dir():
            check_tiny_shape(Path(self.path).expanduser(), self.tiny_shape)
        return self


# Each evaluation queues all of its games at once and keeps every record until it ends: 100,000 games bound the
# memory and the wait (a 95% Wilson interval is already +-0.003 wide there).
MAX_EVAL_GAMES = 100_000


class EvaluationConfig(Settings):
    """Blocking evaluation before and after training (learner vs the eval opponent, seats alternated)."""

    games_at_start: int = Field(20, ge=0, le=MAX_EVAL_GAMES, description="eval games before the first update")
    games_at_end: int = Field(20, ge=0, le=MAX_EVAL_GAMES, description="eval games after the last update")


class RunConfig(Settings):
    """A whole training run."""

    run: RunSection = RunSection()
    model: ModelConfig
    inference: InferenceConfig = InferenceConfig()
    collector: CollectorConfig
    pool: PoolConfig = PoolConfig()
    buffer: BufferConfig = BufferConfig()
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    evaluation: EvaluationConfig = EvaluationConfig()
    tracker: TrackerConfig = TrackerConfig()
    warm_start: WarmStartConfig | None = None

    @property
    def served_lora_rank(self) -> int | None:
        """The largest LoRA rank the inference engine serves: the LoRA learner's and its initial adapter's, and
        that of every opponent given as an adapter directory (None: no adapter at all)."""
        from unstable.inference.lora import adapter_rank

        opponents = [parse_opponent(name) for name in self.pool.fixed_opponents + self.collector.evaluation_opponents]
        adapters = [o.checkpoint.path for o in opponents if o.checkpoint is not None]
        lora, start = self.learner.policy.lora, self.learner.policy.initial_lora_path
        if lora is not None and start:
            adapters.append(start)
        ranks = [adapter_rank(path) for path in adapters] + ([lora.lora_rank] if lora is not None else [])
        return max(ranks, default=None)

    @model_validator(mode="after")
    def _warm_start_seats_every_player(self) -> RunConfig:
        players = self.collector.training_envs[0].num_players
        if self.warm_start is not None and len(self.warm_start.agents) != players:
            raise ValueError(
                f"warm_start.agents {self.warm_start.agents} must name one scripted agent per seat of the first "
                f"training env ({players} players)"
            )
        return self

    @model_validator(mode="after")
    def _api_opponents_have_an_endpoint(self) -> RunConfig:
        names = self.pool.fixed_opponents + self.collector.evaluation_opponents
        api = [name for name in names if parse_opponent(name).api_model]
        if api:
            from pydantic import ValidationError as SettingsError

            from unstable.agents.api import APISettings

            try:
                APISettings.from_env()
            except SettingsError as exc:
                problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"API opponent {api[0]!r}: base_url {problem}") from None
        return self

    @model_validator(mode="after")
    def _buffer_holds_a_batch(self) -> RunConfig:
        batch, room = self.learner.batch_size, self.buffer.max_buffer_size
        if batch > room:
            raise ValueError(
                f"learner.batch_size = {batch} is more than buffer.max_buffer_size = {room}: the buffer never holds "
                "a batch, so the learner would wait forever; raise buffer.max_buffer_size or lower learner.batch_size"
            )
        return self

    @model_validator(mode="after")
    def _past_checkpoints_need_adapters(self) -> RunConfig:
        pool = self.pool
        if (
            self.learner.policy.lora is None
            and pool.sample_mode not in ("mirror", "fixed")
            and pool.max_active_lora > 1
        ):
            raise ValueError(
                f"pool.sample_mode {pool.sample_mode!r} with max_active_lora {pool.max_active_lora} plays past "
                "checkpoints, but full fine-tuning (learner.policy.lora: null) serves only the newest one: use LoRA, "
                "or pool.max_active_lora: 1"
            )
        return self


class ConfigError(ValueError):
    """A config file that does not validate; the message lists every bad field with its value."""


# The settings that name a local file or directory a run may write into its own directory (the warm start's
# checkpoint): a run's `config.yaml` holds them absolute, or relative to the run directory when inside it.
PATH_FIELDS = ("model.path", "learner.policy.initial_lora_path")


def load_config(path: str | Path, overrides: list[str] | None = None, run_dir: str | Path | None = None) -> RunConfig:
    """Read YAML, apply `key.path=value` overrides, validate. Raises ConfigError naming each bad field. With
    `run_dir` (a run's own `config.yaml`), a relative `PATH_FIELDS` value that names something inside `run_dir` is
    read from there (overrides stay relative to the working directory)."""
    path = Path(path)
    data = _read_yaml(path)
    if run_dir is not None:
        _upgrade(data, path)
        for field in PATH_FIELDS:
            _set_field(data, field, _inside(_get_field(data, field), Path(run_dir)))
    for override in overrides or []:
        _apply_override(data, override)
    return validate_config(data, source=str(path))


def _upgrade(data: dict[str, Any], path: Path) -> None:
    """A run's `config.yaml` written before the learner's `policy` and `optimizer` sections, in place: its fields
    named flat under `learner:` moved into them, with a warning (the resumed run writes the file anew)."""
    learner = data.get("learner")
    if not isinstance(learner, dict):
        return
    try:
        data["learner"] = nest_flat_fields(learner)
    except ValueError as exc:
        raise ConfigError(f"invalid config {path}: learner: {exc}") from None
    moved = sorted(set(learner) - set(data["learner"]))
    if moved:
        log.warning("%s was written before learner.policy and learner.optimizer: moved %s into them", path, moved)


def run_config_data(cfg: RunConfig, run_dir: str | Path) -> dict[str, Any]:
    """`cfg` as the data of the run's `config.yaml`: each `PATH_FIELDS` value that names a local path absolute, or
    relative to `run_dir` when inside it, so the run resumes from any working directory, and moved or copied."""
    data = cfg.model_dump(mode="json")
    root = Path(run_dir).resolve()
    for field in PATH_FIELDS:
        value = _get_field(data, field)
        if value is not None and Path(value).exists():
            full = Path(value).resolve()
            _set_field(data, field, str(full.relative_to(root)) if full.is_relative_to(root) else str(full))
    return data


def with_absolute_paths(cfg: RunConfig) -> RunConfig:
    """`cfg` with each `PATH_FIELDS` value that names a local path made absolute from the working directory: the
    config a run's actors get, whose working directory is not the driver's on a Ray cluster the run joins."""
    for field in PATH_FIELDS:
        value = reduce(getattr, field.split("."), cfg)
        if value is not None and not Path(value).is_absolute() and Path(value).exists():
            cfg = _with_field(cfg, field.split("."), str(Path(value).resolve()))
    return cfg


def _with_field(settings: Any, names: list[str], value: Any) -> Any:
    """A copy of the settings model `settings` with its field at the path `names` set to `value` (not validated
    again: the value is the same path, spelled absolutely)."""
    head, *rest = names
    inner = _with_field(getattr(settings, head), rest, value) if rest else value
    return settings.model_copy(update={head: inner})


def _inside(value: str | None, run_dir: Path) -> str | None:
    """`run_dir / value` when `value` is relative and names something there, else `value`."""
    if value is None or Path(value).is_absolute() or not (run_dir / value).exists():
        return value
    return str(run_dir / value)


def _get_field(data: dict[str, Any], field: str) -> Any:
    for part in field.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _set_field(data: dict[str, Any], field: str, value: Any) -> None:
    *sections, name = field.split(".")
    for part in sections:
        if not isinstance(data, dict) or part not in data:
            return
        data = data[part]
    if isinstance(data, dict) and name in data:
        data[name] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    """The mapping of sections in the YAML file `path`, or a one-line ConfigError naming the file and the fault."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_fault(exc)}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty")
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} holds a {type(data).__name__}, not a mapping of sections (run:, model:, collector:, "
            "...)"
        )
    return data


def _yaml_fault(exc: yaml.YAMLError) -> str:
    """Where a YAML parse failed (1-based line and column) and why, on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    if "'\\t'" in problem:  # PyYAML's "found character '\t' that cannot start any token"
        return f"{where}: a tab; tabs are not allowed in YAML indentation (indent with spaces)"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        problem += f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    return f"{where}: {problem}"


def validate_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a config dict; the error is one line naming each bad field's path, its value and the rule."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            if isinstance(value, dict):  # a whole section: its own validator's message names the fields
                problems.append(f"{field}: {message}" if field else message)
            else:
                problems.append(f"{field} = {value!r}: {message}")
        raise ConfigError(f"invalid config {source}: " + "; ".join(problems)) from None


def _apply_override(data: dict[str, Any], override: str) -> None:
    """Set `key.path` of `data` to the YAML `value` of `override`, making missing sections on the way."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form key.path=value")
    key, raw = override.split("=", 1)
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1], 1):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[:depth])} is {node!r}, not a section")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: the value is not valid YAML: {_yaml_fault(exc)}") from None
