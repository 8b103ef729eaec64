"""A launcher for training functions: `python my_launcher.py train|tune [--config x.yaml] [--field=value ...]`.

    def train(cfg: MyConfig) -> dict[str, float]:   # returns eval stats holding cfg.primary_stat (or a float)
        ...

    if __name__ == "__main__":
        unstable.rl.cli.run(train, MyConfig)

`train` writes the config to the run directory and calls the function once. `tune` runs an optuna study over
the config fields that declare a search space (`knob(..., tune=FloatRange(...))`), except those set in the
config file or on the command line: each trial trains `--seeds` times (seeds `seed`, `seed + 1`, ...) and
scores the mean primary stat. The study lives in `<run_dir>/tune.db` (SQLite, so an interrupted tune resumes)
and the best config is written to `<run_dir>/best_config.yaml`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from unstable.rl.config import Choice, FloatRange, IntRange, TrainerConfig, field_types

C = TypeVar("C", bound=TrainerConfig)
TrainFn = Callable[[C], Mapping[str, float] | float]

CONFIG_FILE = "config.yaml"
STUDY_FILE = "tune.db"
BEST_CONFIG_FILE = "best_config.yaml"
SEED_SCORE_ATTR = "seed_scores"


def run(train_fn: TrainFn, config_type: type[C], argv: Sequence[str] | None = None) -> Any:
    """Parse the command line and `train` or `tune`; returns the train result or the best config."""
    parser = argparse.ArgumentParser(description="Train, or tune the hyper-parameters of, an agent.")
    commands = parser.add_subparsers(dest="command", required=True)
    # no abbreviations: `--seed=3` must set the config's seed, not tune's `--seeds`
    train_parser = commands.add_parser("train", help="train once; --field=value sets a field", allow_abbrev=False)
    tune_parser = commands.add_parser("tune", help="optuna search over fields with a space", allow_abbrev=False)
    for sub in (train_parser, tune_parser):
        sub.add_argument("--config", type=Path, help="YAML file of config fields")
    tune_parser.add_argument("--n-trials", type=int, default=20, help="trials to run (default 20)")
    tune_parser.add_argument("--seeds", type=int, default=3, help="training runs per trial (default 3)")
    args, extra = parser.parse_known_args(argv)
    try:
        fixed = _config_values(args.config, extra, config_type)
        cfg = config_type.from_dict(fixed)
    except ValueError as error:
        parser.error(str(error))
    if args.command == "train":
        return train(train_fn, cfg)
    return tune(train_fn, cfg, n_trials=args.n_trials, seeds=args.seeds, fixed=set(fixed))


def train(train_fn: TrainFn, cfg: C) -> Mapping[str, float] | float:
    """Save `cfg` to its run directory, then train once."""
    cfg.to_yaml(cfg.run_dir / CONFIG_FILE)
    return train_fn(cfg)


def tune(train_fn: TrainFn, base: C, n_trials: int, seeds: int, fixed: Collection[str] = ()) -> C:
    """Run `n_trials` optuna trials of `seeds` trainings each; write and return the best config."""
    import optuna

    if n_trials < 1 or seeds < 1:
        raise ValueError(f"n_trials={n_trials} and seeds={seeds} must be at least 1")
    base.run_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=base.run_name,
        storage=f"sqlite:///{(base.run_dir / STUDY_FILE).resolve()}",
        direction="maximize" if base.primary_stat_higher_is_better else "minimize",
        sampler=optuna.samplers.TPESampler(seed=base.seed),
        load_if_exists=True,
    )

    def objective(trial: optuna.Trial) -> float:
        cfg = base.replace(**suggest(trial, type(base), fixed))
        scores = []
        for offset in range(seeds):
            run = cfg.replace(seed=base.seed + offset, log_dir=str(base.run_dir / f"trial_{trial.number}"))
            scores.append(_score(train(train_fn, run.replace(run_name=f"seed_{offset}")), base.primary_stat))
        trial.set_user_attr(SEED_SCORE_ATTR, scores)
        return sum(scores) / len(scores)

    study.optimize(objective, n_trials=n_trials)
    best = base.replace(**study.best_params)
    best.to_yaml(base.run_dir / BEST_CONFIG_FILE)
    return best


def suggest(trial: Any, config_type: type[TrainerConfig], fixed: Collection[str]) -> dict[str, Any]:
    """A value from each tunable field's search space, for the fields not in `fixed`."""
    values = {}
    for f in dataclasses.fields(config_type):
        space = f.metadata.get("tune")
        if space is None or f.name in fixed:
            continue
        if isinstance(space, FloatRange):
            values[f.name] = trial.suggest_float(f.name, space.low, space.high, log=space.log)
        elif isinstance(space, IntRange):
            values[f.name] = trial.suggest_int(f.name, space.low, space.high, log=space.log)
        elif isinstance(space, Choice):
            values[f.name] = trial.suggest_categorical(f.name, list(space.options))
    return values


def _score(result: Mapping[str, float] | float, primary_stat: str) -> float:
    """The tuning score of one training run: its returned float, or its `primary_stat`."""
    if isinstance(result, Mapping):
        if primary_stat not in result:
            raise ValueError(f"the train function's result lacks primary_stat {primary_stat!r}: {sorted(result)}")
        result = result[primary_stat]
    return float(result) if math.isfinite(float(result)) else float("nan")


def _config_values(path: Path | None, overrides: Sequence[str], config_type: type[TrainerConfig]) -> dict[str, Any]:
    """The fields set by the YAML file at `path` and then by `--field=value` (or `--field value`) overrides."""
    import yaml

    values = {}
    if path is not None:
        values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of config fields")
    return values | parse_overrides(overrides, config_type)


def parse_overrides(args: Sequence[str], config_type: type[TrainerConfig]) -> dict[str, Any]:
    """`['--agent_lr=1e-3', '--run-name', 'x']` to `{'agent_lr': 0.001, 'run_name': 'x'}`; values are YAML
    (so `[64, 64]`, `true`, `null` work) except for str fields, which take the text as is."""
    import yaml

    types = field_types(config_type)
    values: dict[str, Any] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--"):
            raise ValueError(f"expected --field=value, got {arg!r}")
        name, has_value, text = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name not in types:
            raise ValueError(f"unknown config field {name!r} for {config_type.__name__}; known: {sorted(types)}")
        if not has_value:
            if not rest:
                raise ValueError(f"config field {name!r} has no value")
            text = rest.pop(0)
        values[name] = text if types[name] is str else yaml.safe_load(text)
    return values
