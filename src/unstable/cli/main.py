"""The `unstable` command line: train from a YAML config, build the tiny model, list envs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any


def format_progress(row: dict[str, Any], total_steps: int) -> str:
    """One line per learner step: throughput, loss and the rolling eval result."""
    eval_part = "eval n/a"
    if row.get("eval/games"):
        eval_part = (
            f"eval W/D/L {row['eval/win_rate']:.2f}/{row['eval/draw_rate']:.2f}/"
            f"{row['eval/loss_rate']:.2f} (n={row['eval/games']})"
        )
    loss = row.get("learner/pg_loss", row.get("learner/loss", float("nan")))
    return (
        f"step {row.get('learner/step', 0):>4}/{total_steps} | {row['time']:7.1f}s | "
        f"games/s {row.get('collector/games_per_s', 0):5.2f} | tok/s {row.get('inference/tokens_per_s', 0):7.1f} | "
        f"loss {loss:+.4f} | reward {row.get('learner/mean_reward', 0):+.2f} | "
        f"format {row.get('collector/format_ok_rate', 0):.2f} | {eval_part}"
    )


def _format_eval(name: str, table: dict[str, float]) -> str:
    if not table.get("games"):
        return f"  {name}: no games"
    return (
        f"  {name}: W/D/L {table['win']:.2f}/{table['draw']:.2f}/{table['loss']:.2f} over {table['games']} games "
        f"(win 95% CI {table['win_low']:.2f}-{table['win_high']:.2f})"
    )


def cmd_train(args: argparse.Namespace) -> int:
    """`unstable train CONFIG`: run the whole loop and print a summary."""
    from unstable.config import load_config
    from unstable.runtime import train

    cfg = load_config(args.config, args.set)
    total = cfg.learner.num_steps
    print(f"unstable: training {cfg.run.name} for {total} learner steps -> {cfg.run.path}", flush=True)
    summary = train(cfg, on_row=lambda row: print(format_progress(row, total), flush=True))
    print("\n=== summary ===")
    print(f"  run dir: {summary.run_dir}")
    print(
        f"  learner steps: {summary.learner_steps}   training games: {summary.train_games}   "
        f"wall: {summary.wall_seconds:.0f}s"
    )
    print(_format_eval(f"eval vs {cfg.collector.evaluation_opponent} at start", summary.eval_start))
    print(_format_eval(f"eval vs {cfg.collector.evaluation_opponent} at end  ", summary.eval_end))
    return 0


def cmd_build_tiny_model(args: argparse.Namespace) -> int:
    """`unstable build-tiny-model DIR`: build the tiny local Qwen3 model and tokenizer."""
    from unstable.models.tiny import ensure_tiny_model

    print(ensure_tiny_model(args.out_dir))
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    """`unstable envs`: list the TextArena env ids."""
    from unstable.games.registry import available_env_ids

    print("\n".join(available_env_ids()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    parser = argparse.ArgumentParser(prog="unstable", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config")
    train.add_argument("config")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set learner.num_steps=5",
    )
    train.set_defaults(func=cmd_train)
    tiny = sub.add_parser("build-tiny-model", help="build the tiny local test model")
    tiny.add_argument("out_dir")
    tiny.set_defaults(func=cmd_build_tiny_model)
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
