"""`TrainerConfig`: every knob of `TorchTrainer`, each documented with its default, and its YAML round trip.

A field may carry a search space in its metadata (`tune=FloatRange(...)` etc.); `unstable.rl.cli tune` samples
those. Subclass it (as a `@dataclass`) to add your own fields; they load, save and tune the same way.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C", bound="TrainerConfig")


@dataclass(frozen=True)
class FloatRange:
    """A float search space `[low, high]`, sampled on a log scale when `log`."""

    low: float
    high: float
    log: bool = False


@dataclass(frozen=True)
class IntRange:
    """An int search space `[low, high]`, sampled on a log scale when `log`."""

    low: int
    high: int
    log: bool = False


@dataclass(frozen=True)
class Choice:
    """A categorical search space."""

    options: tuple[Any, ...]


def knob(default: Any, doc: str, tune: FloatRange | IntRange | Choice | None = None) -> Any:
    """A config field with its documentation and optional search space (lists defaults are copied per instance)."""
    metadata = {"doc": doc, "tune": tune}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainerConfig:
    """Configuration of a `TorchTrainer` run. See each field's `doc` metadata (and `docs/rl.md`)."""

    run_name: str = knob("run", "Name of the run; its files go to `log_dir/run_name`.")
    log_dir: str = knob("runs", "Folder that holds every run directory.")
    seed: int = knob(0, "Seed for torch, Python and numpy random generators.")
    device: str = knob("cpu", "Torch device of the agent and value function (Accelerate overrides it).")
    use_accelerate: str = knob("auto", "'auto': use HF Accelerate when under `accelerate launch`; 'always' or 'never'.")

    discount: float = knob(0.99, "Discount factor gamma of future rewards.", FloatRange(0.9, 0.999))
    vtrace_lambda: float = knob(0.95, "Trace decay lambda of V-trace (1 = full traces).", FloatRange(0.8, 1.0))
    vtrace_rho_max: float = knob(1.0, "Clip of V-trace's importance weights on the TD errors (rho bar).")
    vtrace_c_max: float = knob(1.0, "Clip of V-trace's importance weights on the traces (c bar).")

    awr_temperature: float = knob(
        1.0, "Temperature of the AWR weights exp(A / T) on normalised advantages.", FloatRange(0.1, 10.0, log=True)
    )
    awr_exponent_clip: float = knob(8.0, "Largest exponent A / T of an AWR weight before self-normalisation.")
    normalize_advantages: bool = knob(True, "Normalise advantages by running statistics before the AWR weights.")
    advantage_stats_momentum: float = knob(0.1, "Weight of each train step in the running advantage statistics.")

    kl_target: float = knob(
        0.02, "Target of the mean per-step KL from the pre-step policy.", FloatRange(0.001, 0.2, log=True)
    )
    kl_coef_init: float = knob(0.1, "Initial KL Lagrange multiplier.")
    kl_coef_min: float = knob(0.001, "Smallest KL Lagrange multiplier.")
    kl_coef_max: float = knob(100.0, "Largest KL Lagrange multiplier.")
    kl_coef_lr: float = knob(0.05, "Learning rate of the KL multiplier's own Adam (on its log).")
    use_exact_kl: bool = knob(True, "Use exact KL from `AgentOutput.action_dists` when the agent returns them.")

    agent_lr: float = knob(3e-4, "Adam learning rate of the agent.", FloatRange(1e-5, 3e-3, log=True))
    agent_weight_decay: float = knob(0.0, "AdamW weight decay of the agent.")
    grad_norm_max: float = knob(1.0, "Clip of the global gradient norm of every optimizer step.")
    policy_epochs: int = knob(4, "Passes over the buffer of the agent's loss per train step (step 3).", IntRange(1, 8))
    minibatch_max_size: int = knob(
        4096, "Time-step budget of one agent minibatch; halves on out-of-memory and grows back after success."
    )
    extra_loss_coef: float = knob(1.0, "Coefficient of each `AgentOutput.extra_loss`.")

    vf_hidden_sizes: list[int] = knob([128, 128], "Hidden layer widths of the value MLP on state encodings.")
    vf_lr: float = knob(1e-3, "Adam learning rate of the value MLP.", FloatRange(1e-4, 1e-2, log=True))
    vf_pre_epochs: int = knob(
        4, "Value-only epochs on frozen encodings before the advantages (step 1).", IntRange(0, 10)
    )
    vf_post_epochs: int = knob(2, "Value-only epochs on frozen encodings after the agent's update (step 4).")
    vf_minibatch_size: int = knob(512, "Time-steps per value-only minibatch.")
    vf_loss_coef: float = knob(0.1, "Weight of the value loss through live encodings in the agent's loss (step 3).")

    replay_buffer_steps: int = knob(
        4096,
        "Time-steps kept for training; the oldest episodes are dropped first. Set it to the steps collected "
        "per train step for on-policy training.",
    )
    checkpoint_interval: int = knob(1, "Train steps between checkpoints (0 = never).")
    checkpoint_best: bool = knob(True, "Also save `best.pt` whenever the primary stat improves.")
    primary_stat: str = knob("eval/mean_return", "Eval stat that defines the best checkpoint and the tuning score.")
    primary_stat_higher_is_better: bool = knob(True, "Whether a larger primary stat is better.")

    def __post_init__(self) -> None:
        _check_types(self)
        _check_positive(self, "discount", "awr_temperature", "agent_lr", "vf_lr", "kl_target", "grad_norm_max")
        _check_positive(self, "policy_epochs", "minibatch_max_size", "vf_minibatch_size", "replay_buffer_steps")
        _check_positive(self, "kl_coef_min", "kl_coef_lr")
        if self.use_accelerate not in ACCELERATE_MODES:
            raise ValueError(f"use_accelerate={self.use_accelerate!r} is not one of {ACCELERATE_MODES}")
        if not 0 <= self.vtrace_lambda <= 1:
            raise ValueError(f"vtrace_lambda={self.vtrace_lambda} must be in [0, 1]")
        if not 0 < self.advantage_stats_momentum <= 1:
            raise ValueError(f"advantage_stats_momentum={self.advantage_stats_momentum} must be in (0, 1]")
        if not self.kl_coef_min <= self.kl_coef_init <= self.kl_coef_max:
            raise ValueError(f"kl_coef_init={self.kl_coef_init} must be in [kl_coef_min, kl_coef_max]")

    @property
    def run_dir(self) -> Path:
        """`log_dir/run_name`: where checkpoints, the config and tuning studies of this run live."""
        return Path(self.log_dir) / self.run_name

    @classmethod
    def from_dict(cls: type[C], values: dict[str, Any]) -> C:
        """Build a config from a mapping; an unknown key fails with its name and the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config field {unknown[0]!r} for {cls.__name__}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_yaml(cls: type[C], path: str | Path) -> C:
        """Load a config saved by `to_yaml` (or written by hand: missing fields keep their defaults)."""
        import yaml

        values = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path} must hold a mapping of config fields, got {type(values).__name__}")
        return cls.from_dict(values)

    def to_yaml(self, path: str | Path) -> None:
        """Write every field to `path` as YAML."""
        import yaml

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    def replace(self: C, **changes: Any) -> C:
        """A copy with `changes` applied (and validated); unknown names fail like `from_dict`."""
        return type(self).from_dict(self.to_dict() | changes)


ACCELERATE_MODES = ("auto", "always", "never")


def field_types(cls: type[TrainerConfig]) -> dict[str, Any]:
    """Each field's resolved type annotation (`int`, `float`, `list[int]`, ...)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_types(cfg: TrainerConfig) -> None:
    """Raise unless every field holds its annotated type (an int is accepted, and converted, for a float)."""
    for name, kind in field_types(type(cfg)).items():
        setattr(cfg, name, _checked(name, getattr(cfg, name), kind))


def _checked(name: str, value: Any, kind: Any) -> Any:
    """`value` if it is of type `kind` (a plain type, a generic like `list[int]` or a union), else raise."""
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    for option in options:
        base = typing.get_origin(option) or option
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, base) and not (base is int and isinstance(value, bool)):
            return value
    kind_name = kind.__name__ if isinstance(kind, type) else str(kind)
    raise ValueError(f"config field {name}={value!r} must be of type {kind_name}")


def _check_positive(cfg: TrainerConfig, *names: str) -> None:
    """Raise naming the first of `names` that is not a positive finite number."""
    for name in names:
        value = getattr(cfg, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"config field {name}={value!r} must be positive")
