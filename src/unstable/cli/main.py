"""The `unstable` command line: train from a YAML config, watch a run (`dashboard`), plot it (`report`),
warm-start by SFT, evaluate, play a checkpoint yourself, build the tiny model, list envs."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unstable.models.tiny import TinyShape


class ProgressBar:
    """One task of a Rich progress bar: `advance()` counts a unit of work, `set_total(n)` sets how many there are
    once that is known (a spinner until then)."""

    def __init__(self, bar: Any, task: Any):
        self._bar = bar
        self._task = task

    def advance(self) -> None:
        """One more unit done."""
        self._bar.advance(self._task)

    def set_total(self, total: int) -> None:
        """The task has `total` units in all."""
        self._bar.update(self._task, total=total)


@contextmanager
def progress(description: str, total: int | None = None) -> Iterator[ProgressBar]:
    """A Rich progress bar on stderr for long work (a spinner while its total is None); yields its `ProgressBar`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total)
        yield ProgressBar(bar, task)
        if bar.tasks[0].total is None:  # the spinner's work is done: show it as one finished step
            bar.update(task, total=1, completed=1)


def build_tiny_model_with_progress(out_dir: str | Path, shape: TinyShape | None = None) -> Path:
    """The tiny model of `shape` (default: the demo's) at `out_dir`, built first (behind a spinner) when it is
    missing."""
    from unstable.models.tiny import ensure_tiny_model

    if (Path(out_dir) / "config.json").is_file():
        return ensure_tiny_model(out_dir, shape)  # checks the shape
    with progress(f"building the tiny model in {out_dir}"):
        return ensure_tiny_model(out_dir, shape)


PROGRESS_OPPONENTS = 3  # opponents whose win rate the progress line shows


def format_progress(row: dict[str, Any], total_steps: int) -> str:
    """One line per learner step: throughput, loss and what is learning, the training win rate against each
    opponent over the tracker's rolling window (the most played first, at most `PROGRESS_OPPONENTS`)."""
    from unstable.tracking import keys

    loss = f"{row[keys.LOSS]:+.4f}" if keys.LOSS in row else "    n/a"
    return (
        f"step {row.get(keys.STEP, 0):>4}/{total_steps} | {row[keys.TIME]:7.1f}s | "
        f"games/s {row.get(keys.GAMES_PER_S, 0):5.2f} | tok/s {row.get(keys.INFERENCE_TOKENS_PER_S, 0):7.1f} | "
        f"loss {loss} | reward {row.get(keys.MEAN_REWARD, 0):+.2f} | "
        f"format {row.get(keys.FORMAT_OK_RATE, 0):.2f} | {_win_rates(row.get(keys.TRAIN_WDL_BY_OPPONENT) or {})}"
    )


def _win_rates(by_opponent: dict[str, dict[str, float]]) -> str:
    """`win vs random 0.52 (n=480), ckpt-3 0.47 (n=35)`, the most played opponents first; `+k more` beyond
    `PROGRESS_OPPONENTS`; `win vs n/a` while the window holds no game against an opponent (only self-play)."""
    ranked = sorted(by_opponent.items(), key=lambda item: -item[1]["games"])
    shown = [f"{name} {wdl['win_rate']:.2f} (n={wdl['games']})" for name, wdl in ranked[:PROGRESS_OPPONENTS]]
    more = f" +{len(ranked) - PROGRESS_OPPONENTS} more" if len(ranked) > PROGRESS_OPPONENTS else ""
    return f"win vs {', '.join(shown)}{more}" if shown else "win vs n/a"


def _format_eval(name: str, table: dict[str, Any]) -> str:
    failed = f", {table['failed']} failed" if table.get("failed") else ""
    if not table.get("games"):
        return f"  {name}: no games{failed}"
    low, high = table["win_ci"]
    return (
        f"  {name}: W/D/L {table['win_rate']:.2f}/{table['draw_rate']:.2f}/{table['loss_rate']:.2f} over "
        f"{table['games']} games (win 95% CI {low:.2f}-{high:.2f}){failed}"
    )


def _print_warm_epoch(row: dict[str, Any]) -> None:
    print(
        f"warm start epoch {row['epoch']}: loss {row['loss']:.4f} ({row['moves']} moves, {row['updates']} updates)",
        flush=True,
    )


def cmd_train(args: argparse.Namespace) -> int:
    """`unstable train CONFIG` runs the whole loop and prints a summary; `unstable train --resume RUN_DIR`
    continues a run from its last saved state. A run that could not train prints why and exits with status 1."""
    from unstable.config import ConfigError, load_config
    from unstable.runtime import resume_training, train
    from unstable.runtime.driver import check_run_dir
    from unstable.tracking.balance import balance_lines
    from unstable.tracking.history import read_rows

    if (args.config is None) == (args.resume is None):
        raise ConfigError("train needs a CONFIG file or --resume RUN_DIR (not both)")
    overrides = args.set + (["tracker.wandb=disabled"] if args.no_wandb else [])
    if args.resume:
        cfg = load_config(os.path.join(args.resume, "config.yaml"), overrides, run_dir=args.resume)
    else:
        cfg = load_config(args.config, overrides)
    if not args.resume:
        check_run_dir(cfg)  # before the tiny model is built: a run that cannot start does no work
    if cfg.model.build_tiny_if_missing:
        build_tiny_model_with_progress(cfg.model.path, cfg.model.tiny_shape)
    total = cfg.learner.num_steps

    def print_row(row: dict[str, Any]) -> None:
        print(format_progress(row, total), flush=True)

    if cfg.warm_start is not None:  # a new run's, or a resumed one's killed before its warm start ended
        ws = cfg.warm_start
        print(
            f"unstable: warm start, SFT on the moves of {' vs '.join(ws.agents)} in {ws.games} games, "
            f"{ws.epochs} epochs",
            flush=True,
        )
    if args.resume:
        print(f"unstable: resuming {args.resume} up to {total} learner steps", flush=True)
        summary = resume_training(args.resume, overrides, on_row=print_row, on_warm_start_epoch=_print_warm_epoch)
    else:
        print(f"unstable: training {cfg.run.name} for {total} learner steps", flush=True)
        summary = train(cfg, on_row=print_row, on_warm_start_epoch=_print_warm_epoch)
    if summary.already_finished:
        print(f"unstable: {summary.run_dir} is finished ({total} learner steps); raise learner.num_steps to go on")
    print("\n=== summary ===")
    print(
        f"  learner steps: {summary.learner_steps}   training games: {summary.train_games} "
        f"({summary.train_failed} failed)   wall: {summary.wall_seconds:.0f}s"
    )
    opponents = ", ".join(cfg.collector.evaluation_opponents)
    print(_format_eval(f"eval vs {opponents} at start", summary.eval_start))
    print(_format_eval(f"eval vs {opponents} at end  ", summary.eval_end))
    if summary.warm_start_checkpoint:
        print(f"  warm start: {summary.warm_start_checkpoint}")
    if (Path(summary.run_dir) / "metrics.jsonl").exists():  # a run stopped in its start may have written none
        for line in balance_lines(read_rows(summary.run_dir)):
            print(f"  {line}")
    print(f"  run dir: {summary.run_dir} (config.yaml, metrics.jsonl, checkpoints/, logs/)")
    print(f"  watch or plot it: unstable dashboard {summary.run_dir}   unstable report {summary.run_dir}")
    if summary.stopped:
        print(f"error: the run stopped: {summary.stopped}", file=sys.stderr)
        return 1
    return 0


def check_makeable(option: str, path: str) -> None:
    """A ConfigError naming `option` and `path` when directory `path` could not be made (checked before any work)."""
    from unstable.config import ConfigError
    from unstable.tracking import cannot_make

    problem = cannot_make(Path(path))
    if problem:
        raise ConfigError(f"{option} {path}: cannot make it: {problem}")


def cmd_build_tiny_model(args: argparse.Namespace) -> int:
    """`unstable build-tiny-model DIR`: build the tiny local Qwen3 model and tokenizer (of the shape the flags give)."""
    from pydantic import ValidationError

    from unstable.config import ConfigError
    from unstable.models.tiny import TinyShape

    check_makeable("build-tiny-model", args.out_dir)
    try:
        shape = TinyShape(**{name: getattr(args, name) for name in TinyShape.model_fields})
        print(build_tiny_model_with_progress(args.out_dir, shape))
    except (ValidationError, ValueError) as exc:
        raise ConfigError(f"build-tiny-model: {' '.join(str(exc).split())}") from None
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """`unstable dashboard [RUN]`: the live terminal view of a run (default: the latest under --runs)."""
    from unstable.dashboard import watch
    from unstable.tracking.history import find_latest_run

    try:
        watch(args.run or find_latest_run(args.runs), args.interval, once=args.once)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """`unstable report RUN_DIR`: PNG plots and report.md of a run, from its metrics.jsonl."""
    from unstable.report import write_report

    if args.out:
        check_makeable("--out", args.out)
    try:
        path = write_report(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    """`unstable envs`: list the TextArena env ids."""
    from unstable.games.registry import available_env_ids

    print("\n".join(available_env_ids()))
    return 0


def _arg_type(check: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse `type` that validates a value with `check` and reports its ValueError message."""

    def parse(value: str) -> str:
        try:
            check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return parse


def _scripted_agent(name: str) -> None:
    from unstable.agents.scripted import make_scripted_agent

    make_scripted_agent(name, seed=0)


def _opponent(name: str) -> None:
    from unstable.agents.seating import parse_opponent

    parse_opponent(name)


def _env_id(env_id: str) -> None:
    from unstable.games.registry import validate_env_id

    validate_env_id(env_id)


def _template(name: str) -> None:
    from unstable.games.templates import get_template

    get_template(name)


def _setting_flag(parser: argparse.ArgumentParser, flag: str, model, setting: str, **options) -> None:
    """Add `flag` for the field of settings model `model` that a run config calls `setting` (its last part names the
    field): its default and help are the field's, so the command and `unstable train` have one source; the command
    validates the value with `model`."""
    info = model.model_fields[setting.rpartition(".")[2]]
    default = info.get_default(call_default_factory=True)
    if isinstance(default, list):
        options.setdefault("nargs", "+")
    else:
        options.setdefault("type", type(default))
    description = info.description.replace("%", "%%")  # argparse formats help strings with %
    help_text = f"{description} (default: %(default)s; `{setting}` in a run config)"
    parser.add_argument(flag, default=default, help=help_text, **options)


def _add_model_and_env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="base model directory or hub id")
    parser.add_argument("--build-tiny", action="store_true", help="build the tiny test model at --model if missing")
    parser.add_argument("--env", default="TicTacToe-v0-train", type=_arg_type(_env_id), help="TextArena env id")
    parser.add_argument("--num-players", type=int, default=2)
    parser.add_argument("--template", default="qwen3-zs", type=_arg_type(_template), help="prompt template")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")


def check_threads(threads: int | None) -> None:
    """A ConfigError when `--threads` is set outside 1..MAX_THREADS."""
    from unstable.config import ConfigError
    from unstable.settings import MAX_THREADS

    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads {threads}: at least 1, at most {MAX_THREADS}")


def _model_and_spec(args: argparse.Namespace):
    """The model path (the tiny model built there first with --build-tiny) and the game, after checking the model
    path and --threads: a bad one is a ConfigError before any work."""
    from unstable.config import ConfigError
    from unstable.config.schema import check_model_path
    from unstable.records import EnvSpec

    try:
        check_model_path(args.model, build_tiny=args.build_tiny)
    except ValueError as exc:
        raise ConfigError(f"--model {args.model}: {exc}") from None
    if args.build_tiny:
        check_makeable("--model", args.model)
    check_threads(args.threads)
    model = str(build_tiny_model_with_progress(args.model)) if args.build_tiny else args.model
    return model, EnvSpec(args.env, args.num_players, args.template)


def _print_epoch(row: dict[str, float]) -> None:
    print(f"epoch {row['epoch']}: loss {row['loss']:.4f} ({row['updates']} updates)", flush=True)


# `unstable sft`'s flag for each settings field it fills
SFT_FLAGS = {
    "agents": "--agents", "games": "--games", "epochs": "--epochs", "batch_size": "--batch-size",
    "learning_rate": "--lr", "lora_rank": "--lora-rank", "lora_alpha": "--lora-rank",
}  # fmt: skip


@contextlib.contextmanager
def _flags_named(flags: dict[str, str]):
    """Turn a settings model's ValidationError inside the block into a ConfigError naming the command-line flag
    (`flags`: field -> flag; otherwise `--field-name`) and the value given."""
    from pydantic import ValidationError

    from unstable.config import ConfigError

    try:
        yield
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0])
        raise ConfigError(
            f"{flags.get(field, '--' + field.replace('_', '-'))} {error['input']}: {error['msg']}"
        ) from None


def cmd_sft(args: argparse.Namespace) -> int:
    """`unstable sft`: warm-start a model on the moves of scripted agents (`learner.sft.warm_start`, as
    `unstable train`'s `warm_start:` does); prints the checkpoint path."""
    from unstable.learner import LoraConfig, PolicyConfig, WarmStartConfig
    from unstable.learner.sft import warm_start

    check_makeable("--out-dir", args.out_dir)
    model, spec = _model_and_spec(args)
    with _flags_named(SFT_FLAGS):
        ws = WarmStartConfig(
            agents=args.agents, games=args.games, epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr
        )
        lora = LoraConfig(lora_rank=args.lora_rank, lora_alpha=2 * args.lora_rank)
    if args.lora_targets:
        lora.target_modules = args.lora_targets
    with progress("SFT updates") as bar:

        def announce(moves: int) -> None:
            print(f"unstable: {moves} supervised moves from {ws.games} games of {' vs '.join(ws.agents)}", flush=True)
            bar.set_total(ws.epochs * math.ceil(moves / ws.batch_size))

        path = warm_start(
            model,
            spec,
            ws,
            policy=PolicyConfig(lora=None if args.full_finetune else lora),
            out_dir=args.out_dir,
            seed=args.seed,
            num_threads=args.threads,
            on_moves=announce,
            on_epoch=_print_epoch,
            on_update=lambda metrics: bar.advance(),
        )
    print(f"checkpoint: {path}")
    return 0


def check_probe(positions: int, env_id: str) -> None:
    """A ConfigError when `--probe` asks for a negative number of positions or for a game other than TicTacToe."""
    from unstable.config import ConfigError
    from unstable.evaluation.probe import is_tictactoe
    from unstable.records import EnvSpec

    if positions < 0:
        raise ConfigError(f"--probe {positions}: a number of positions, 0 (no probe) or more")
    if positions and not is_tictactoe(EnvSpec(env_id, 2, "")):
        raise ConfigError(
            f"--probe {positions}: the skill probe reads TicTacToe boards; --env {env_id} is another game"
        )


def cmd_eval(args: argparse.Namespace) -> int:
    """`unstable eval`: play a checkpoint against opponents, print the W/D/L table and write it as JSON."""
    from unstable.config import ConfigError
    from unstable.evaluation.evaluate import evaluate, format_report, write_report
    from unstable.inference import InferenceConfig

    if args.adapter and not Path(args.adapter).is_dir():
        raise ConfigError(f"--adapter {args.adapter}: no such adapter directory")
    check_probe(args.probe, args.env)
    if args.out:
        check_makeable("--out", str(Path(args.out).parent))
    check_threads(args.threads)
    with _flags_named({}):
        inference = InferenceConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, num_threads=args.threads
        )
    model, spec = _model_and_spec(args)
    with progress("eval games", args.games * len(args.opponents)) as bar:
        report = evaluate(
            model,
            spec,
            args.opponents,
            adapter=args.adapter,
            games_per_opponent=args.games,
            inference=inference,
            concurrency=args.concurrency,
            seed=args.seed,
            probe_positions=args.probe,
            on_game=lambda record: bar.advance(),
        )
    print(format_report(report))
    if args.out:
        print(f"report: {write_report(report, args.out)}")
    return 0


def _play_setup(args: argparse.Namespace):
    """The opponent, the model it is served on (None: no model), the game and the model's sampling settings of
    `unstable play`, every argument checked first: a bad one is a ConfigError before any work, nothing created."""

    from unstable.config import ConfigError
    from unstable.config.schema import check_model_path
    from unstable.evaluation.play import resolve_opponent
    from unstable.games.registry import validate_env_id
    from unstable.inference import InferenceConfig
    from unstable.records import EnvSpec

    try:
        validate_env_id(args.env)
    except ValueError as exc:
        raise ConfigError(f"--env {args.env}: {exc}") from None
    if not 0 <= args.seat < args.num_players:
        raise ConfigError(f"--seat {args.seat}: a seat of the {args.num_players} players, 0 to {args.num_players - 1}")
    check_makeable("--out", args.out)
    check_threads(args.threads)
    with _flags_named({}):
        inference = InferenceConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, num_threads=args.threads
        )
    try:
        opponent, model = resolve_opponent(args.checkpoint, args.model)
    except ValueError as exc:
        raise ConfigError(f"CHECKPOINT {args.checkpoint}: {exc}") from None
    if model is not None:
        try:
            check_model_path(model)
        except ValueError as exc:
            named = "CHECKPOINT" if model == args.checkpoint else "--model" if args.model else "recorded base model"
            raise ConfigError(f"{named} {model}: {exc}") from None
    return opponent, model, EnvSpec(args.env, args.num_players, args.template), inference


def cmd_play(args: argparse.Namespace) -> int:
    """`unstable play CHECKPOINT`: a person plays one game against a checkpoint or a pool opponent in the
    terminal; the game is saved under --out. End of input (Ctrl-D) or `quit` leaves the game unsaved."""
    from unstable.agents.human import QUIT, HumanAgent, PlayerQuit
    from unstable.evaluation.play import describe_result, play_person
    from unstable.records import append_games

    opponent, model, spec, inference = _play_setup(args)
    if model is not None:
        base = f" (on {model})" if model != args.checkpoint else ""
        print(f"unstable: loading {args.checkpoint}{base}", flush=True)
    print(
        f"unstable: you are player {args.seat} of {spec.env_id} against {args.checkpoint}; type your move in the "
        f"game's format (e.g. [4]), or {QUIT}",
        flush=True,
    )
    try:
        record = play_person(spec, HumanAgent(), args.seat, opponent, model, inference, seed=args.seed)
    except (PlayerQuit, KeyboardInterrupt):
        print("\nunstable: you left the game; it is not saved")
        return 0
    print(f"\nunstable: {describe_result(record, args.seat)}")
    print(f"game saved: {append_games(args.out, [record])}")
    return 1 if record.failed else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    from unstable.inference.config import InferenceConfig
    from unstable.learner.config import LoraConfig, WarmStartConfig
    from unstable.models.tiny import TinyShape

    parser = argparse.ArgumentParser(prog="unstable", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config")
    train.add_argument("config", nargs="?", help="the run's YAML config (not with --resume)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue this run directory from its last saved state")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set learner.num_steps=5",
    )
    train.add_argument("--no-wandb", action="store_true", help="do not log to W&B (same as tracker.wandb=disabled)")
    train.set_defaults(func=cmd_train)
    dashboard = sub.add_parser("dashboard", help="watch a run live in the terminal")
    dashboard.add_argument("run", nargs="?", default=None, help="a run directory (default: the latest under --runs)")
    dashboard.add_argument("--runs", default="runs", help="where to look for the latest run")
    dashboard.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    dashboard.add_argument("--once", action="store_true", help="print one frame and exit")
    dashboard.set_defaults(func=cmd_dashboard)
    report = sub.add_parser("report", help="plot a run and summarise it as Markdown")
    report.add_argument("run_dir")
    report.add_argument("--out", default=None, help="where to write (default: RUN_DIR/report)")
    report.set_defaults(func=cmd_report)
    tiny = sub.add_parser("build-tiny-model", help="build the tiny local test model")
    tiny.add_argument("out_dir")
    for name in TinyShape.model_fields:
        _setting_flag(tiny, f"--{name.replace('_', '-')}", TinyShape, f"model.tiny_shape.{name}")
    tiny.set_defaults(func=cmd_build_tiny_model)
    sft = sub.add_parser("sft", help="warm-start a model by SFT on moves of scripted agents")
    _add_model_and_env_args(sft)
    _setting_flag(sft, "--agents", WarmStartConfig, "warm_start.agents", type=_arg_type(_scripted_agent))
    _setting_flag(sft, "--games", WarmStartConfig, "warm_start.games")
    _setting_flag(sft, "--epochs", WarmStartConfig, "warm_start.epochs")
    _setting_flag(sft, "--batch-size", WarmStartConfig, "warm_start.batch_size")
    _setting_flag(sft, "--lr", WarmStartConfig, "warm_start.learning_rate")
    _setting_flag(sft, "--lora-rank", LoraConfig, "learner.policy.lora.lora_rank")
    sft.add_argument(
        "--lora-targets",
        nargs="+",
        default=None,
        help="LoRA target modules (default: the learner's); the random tiny model also needs lm_head",
    )
    sft.add_argument("--full-finetune", action="store_true", help="train every weight and save a full model")
    sft.add_argument("--out-dir", default="runs/sft")
    sft.set_defaults(func=cmd_sft)
    evaluation = sub.add_parser("eval", help="evaluate a checkpoint against opponents")
    _add_model_and_env_args(evaluation)
    evaluation.add_argument("--adapter", default=None, help="LoRA adapter directory of the checkpoint")
    evaluation.add_argument(
        "--opponents", nargs="+", default=["random"], type=_arg_type(_opponent), help="scripted names or adapter dirs"
    )
    evaluation.add_argument("--games", type=int, default=20, help="games per opponent (seats alternate)")
    _setting_flag(evaluation, "--temperature", InferenceConfig, "inference.temperature")
    _setting_flag(evaluation, "--max-new-tokens", InferenceConfig, "inference.max_new_tokens")
    evaluation.add_argument("--concurrency", type=int, default=32, help="games in flight")
    evaluation.add_argument(
        "--probe",
        type=int,
        default=0,
        metavar="POSITIONS",
        help="TicTacToe: score the skill probe at this many positions",
    )
    evaluation.add_argument("--out", default=None, help="write the report as JSON here")
    evaluation.set_defaults(func=cmd_eval)
    play = sub.add_parser("play", help="play a checkpoint or a pool opponent yourself, in the terminal")
    play.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a LoRA adapter or whole-model checkpoint directory, or a pool opponent's name (random, "
        "tictactoe-minimax, an API model 'org/model')",
    )
    play.add_argument("--env", default="TicTacToe-v0", help="TextArena env id")
    play.add_argument("--seat", type=int, default=0, help="your seat (player id): 0 moves first")
    play.add_argument(
        "--model", default=None, help="the base model of an adapter CHECKPOINT (default: the one it records)"
    )
    play.add_argument("--num-players", type=int, default=2)
    play.add_argument("--template", default="qwen3-zs", type=_arg_type(_template), help="the model's prompt template")
    _setting_flag(play, "--temperature", InferenceConfig, "inference.temperature")
    _setting_flag(play, "--max-new-tokens", InferenceConfig, "inference.max_new_tokens")
    play.add_argument("--seed", type=int, default=0)
    play.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    play.add_argument("--out", default="runs/play", help="the directory whose records.jsonl the game is added to")
    play.set_defaults(func=cmd_play)
    envs = sub.add_parser("envs", help="list TextArena env ids")
    envs.set_defaults(func=cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `unstable` command."""
    from unstable.config import ConfigError

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
