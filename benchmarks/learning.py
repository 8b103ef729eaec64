"""Learning benchmark: does a recipe's RL make the tiny model play better than its warm start, across seeds?

A recipe is a config file that `unstable train` reads (`examples/*.yaml`). Each recipe runs once per seed of
`--seeds` through `unstable.runtime.train` with only the overrides a benchmark needs (`run.seed`, `run.dir`, no
in-run evaluation, metrics.jsonl only, the curve's checkpoints kept), then yours (`--set`, applied last). Then
the warm start and the last checkpoint play `--eval-games` games against each of the game's opponents (TicTacToe:
random and minimax; Kuhn Poker: random and the equilibrium agent, plus the policy's exact exploitability), and the
`--curve-points` checkpoints in between are scored (TicTacToe: win rate against random in `--curve-games` games;
Kuhn Poker: exploitability).

Writes `learning.json` and one `learning-<recipe>.png` per recipe under `--out`, checkpoints under `--runs-dir`,
and prints a table. Run on demand:

    python benchmarks/learning.py                      # the benchmark's recipes (RECIPES), seeds 0 1 2
    python benchmarks/learning.py examples/tictactoe-tiny.yaml --eval-games 200 --curve-points 2    # the demo's
    python benchmarks/learning.py examples/tictactoe-tiny-strong.yaml --set learner.algorithm.name=ppo
    python benchmarks/learning.py --smoke --out /tmp/learning   # 2 learner steps and a few games per recipe
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from recorded import settings  # noqa: E402

from unstable.config import ConfigError, RunConfig, load_config  # noqa: E402
from unstable.evaluation.evaluate import evaluate, kuhn_exploitability  # noqa: E402
from unstable.inference import InferenceConfig  # noqa: E402
from unstable.runtime import train  # noqa: E402
from unstable.tracking import keys  # noqa: E402
from unstable.tracking.stats import mean_interval  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECIPES = [ROOT / "examples" / "tictactoe-tiny-strong.yaml", ROOT / "examples" / "kuhn-poker-tiny.yaml"]
# the opponents each game is evaluated against (the first also scores TicTacToe's curve), by env id prefix
OPPONENTS = {"TicTacToe": ["random", "tictactoe-minimax"], "KuhnPoker": ["random", "kuhn-nash"]}
# --smoke: each recipe cut to seconds of work (the run's path is the same, the numbers mean nothing)
SMOKE = [
    "warm_start.games=4",
    "warm_start.epochs=1",
    "learner.num_steps=2",
    "learner.batch_size=4",
    "learner.optimizer.warmup_steps=0",
    "buffer.max_buffer_size=8",
    "collector.num_workers=2",
]
ROW_KEYS = (
    keys.STEP,
    keys.TIME,
    keys.STEP_SECONDS,
    keys.GAME_TOKENS,
    keys.MEAN_REWARD,
    keys.FORMAT_OK_RATE,
    keys.INVALID_MOVE_RATE,
    keys.REF_KL,
)


def game_of(cfg: RunConfig, path: Path) -> str:
    """The game (an `OPPONENTS` key) of the recipe's first training env; a ConfigError for any other game."""
    env_id = cfg.collector.training_specs()[0].env_id
    for game in OPPONENTS:
        if env_id.startswith(game):
            return game
    raise ConfigError(f"recipe {path}: benchmarks/learning.py evaluates {' and '.join(OPPONENTS)}, not {env_id}")


def curve_steps(total: int, points: int) -> list[int]:
    """`points + 1` learner steps from 0 to `total`, evenly spaced."""
    return sorted({round(total * i / points) for i in range(points + 1)})


def recipe_config(path: Path, seed: int, args: argparse.Namespace) -> RunConfig:
    """The recipe at `path` for `seed`: the benchmark's overrides, then `--set` (which win)."""
    steps = load_config(path, args.set).learner.num_steps
    overrides = [
        f"run.seed={seed}",
        f"run.dir={args.runs_dir}/seed-{seed}",
        f"run.name={path.stem}",
        "evaluation.games_at_start=0",  # the benchmark evaluates with its own games, after the run
        "evaluation.games_at_end=0",
        "tracker.wandb=disabled",
        "tracker.tensorboard=false",
        "learner.retention.keep_last=1",  # the curve's checkpoints, not every step's (a 250-step seed: 32 MB)
        f"learner.retention.keep_steps={curve_steps(steps, args.curve_points)}",
    ]
    return load_config(path, [*overrides, *args.set])


def policy(cfg: RunConfig, checkpoint: str | None) -> tuple[str, str | None]:
    """(model path, adapter) that load `checkpoint` of a run of `cfg`: a full model directory, or an adapter on the
    recipe's model (None: the model itself)."""
    if cfg.learner.policy.lora is None:
        return checkpoint or cfg.model.path, None
    return cfg.model.path, checkpoint


def evaluate_at(cfg: RunConfig, checkpoint: str | None, opponents: list[str], games: int, threads: int):
    """`evaluate` of `checkpoint` with the recipe's sampling and the run's seed."""
    base, adapter = policy(cfg, checkpoint)
    inference = InferenceConfig(
        max_new_tokens=cfg.inference.max_new_tokens, temperature=cfg.inference.temperature, num_threads=threads
    )
    spec = cfg.collector.training_specs()[0]
    return evaluate(
        base, spec, opponents, adapter=adapter, games_per_opponent=games, inference=inference, seed=cfg.run.seed
    )


def train_recipe(cfg: RunConfig) -> dict[str, Any]:
    """Run RL; returns the run directory, a checkpoint path per kept step (0: the warm start), the rows' main
    columns, the training games and the seconds."""
    start = time.time()
    rows: list[dict[str, Any]] = []
    summary = train(cfg, on_row=rows.append)
    steps = cfg.learner.num_steps
    first = summary.warm_start_checkpoint or (
        cfg.model.path if cfg.learner.policy.lora is None else cfg.learner.policy.initial_lora_path
    )
    kept = [k for k in range(1, steps + 1) if cfg.learner.retention.keeps(k, steps)]
    return {
        "run_dir": summary.run_dir,
        "checkpoints": {0: first} | {k: f"{summary.run_dir}/checkpoints/ckpt-{k}" for k in kept},
        "train_games": summary.train_games,
        "rows": [{k: four_digits(row[k]) for k in ROW_KEYS if k in row} for row in rows],
        "seconds": time.time() - start,
    }


def outcome_point(step: int, report: dict[str, Any], opponent: str) -> dict[str, Any]:
    """One curve point: the all-seats W/D/L summary of `opponent` in `report`, tagged with the step."""
    result = report["opponents"][opponent]
    return {"step": step, **result["all_seats"], "valid_move_rate": result["valid_move_rate"]}


def run_seed(path: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seed of one recipe: the run, the warm start's and the last checkpoint's evaluations, the curve."""
    cfg = recipe_config(path, seed, args)
    game = game_of(cfg, path)
    opponents = OPPONENTS[game]
    print(f"{path.name} seed {seed}: training", flush=True)
    run = train_recipe(cfg)
    steps = cfg.learner.num_steps
    print(f"{path.name} seed {seed}: evaluating", flush=True)
    warm = evaluate_at(cfg, run["checkpoints"][0], opponents, args.eval_games, args.threads)
    final = evaluate_at(cfg, run["checkpoints"][steps], opponents, args.eval_games, args.threads)
    curve = []
    for step in curve_steps(steps, args.curve_points):
        if game == "KuhnPoker":
            base, adapter = policy(cfg, run["checkpoints"][step])
            score = kuhn_exploitability(base, cfg.collector.training_specs()[0], adapter, cfg.inference.temperature)
            curve.append({"step": step, "exploitability": score["exploitability"]})
        elif step in (0, steps):
            curve.append(outcome_point(step, warm if step == 0 else final, opponents[0]))
        else:
            report = evaluate_at(cfg, run["checkpoints"][step], opponents[:1], args.curve_games, args.threads)
            curve.append(outcome_point(step, report, opponents[0]))
    return {**run, "game": game, "warm_start": warm, "final": final, "curve": with_cost(curve, run["rows"])}


def four_digits(value: Any) -> Any:
    """A row's float to 4 significant digits: the curves need no more, and the tracked results stay small."""
    return float(f"{value:.4g}") if isinstance(value, float) else value


def with_cost(curve: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each curve point with what RL had spent by its step: wall seconds (the learner steps' own, warm start left
    out) and tokens generated in training games (vines included)."""
    seconds, tokens, spent = 0.0, 0, {0: (0.0, 0)}
    for row in rows:
        seconds += row.get(keys.STEP_SECONDS, 0.0)
        tokens += row.get(keys.GAME_TOKENS, 0)
        if keys.STEP in row:
            spent[row[keys.STEP]] = (seconds, tokens)
    names, missing = ("seconds", "generated_tokens"), (None, None)
    return [{**point, **dict(zip(names, spent.get(point["step"], missing)))} for point in curve]


def headline(result: dict[str, Any], report: dict[str, Any]) -> float:
    """The number a seed is judged by: TicTacToe's win rate against random, Kuhn Poker's exploitability."""
    if result["game"] == "KuhnPoker":
        return report["kuhn"]["exploitability"]
    return report["opponents"]["random"]["all_seats"]["win_rate"]


def separated(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the win rate's 95% interval after RL lies wholly above the warm start's."""
    return after["win_ci"][0] > before["win_ci"][1]


def summary(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Across seeds: each seed's headline number before and after RL, the mean change with its 95% t-interval and
    (TicTacToe) how many seeds' win rates separated from their warm starts."""
    per_seed = {}
    for seed, result in seeds.items():
        row = {"before": headline(result, result["warm_start"]), "after": headline(result, result["final"])}
        if result["game"] == "TicTacToe":
            row["separated"] = separated(
                *(r["opponents"]["random"]["all_seats"] for r in (result["warm_start"], result["final"]))
            )
        per_seed[seed] = row
    mean, low, high = mean_interval([row["after"] - row["before"] for row in per_seed.values()])
    return {"per_seed": per_seed, "mean_change": mean, "mean_change_ci": [low, high]}


def rate_text(wdl: dict[str, Any], key: str = "win") -> str:
    """An all-seats W/D/L summary's win rate (or, with key "non-loss", 1 - loss rate) and its 95% interval."""
    if key == "non-loss":
        low, high = wdl["loss_ci"]
        return f"{1 - wdl['loss_rate']:.2f} [{1 - high:.2f}, {1 - low:.2f}]"
    low, high = wdl["win_ci"]
    return f"{wdl['win_rate']:.2f} [{low:.2f}, {high:.2f}]"


def scores_text(result: dict[str, Any], report: dict[str, Any]) -> str:
    """A seed's evaluation in one cell: TicTacToe win vs random and non-loss vs minimax, or Kuhn exploitability
    and win vs random."""
    games = report["opponents"]
    win = f"win vs random {rate_text(games['random']['all_seats'])}"
    if result["game"] == "KuhnPoker":
        return f"exploitability {report['kuhn']['exploitability']:.3f}, {win}"
    return f"{win}, non-loss vs minimax {rate_text(games['tictactoe-minimax']['all_seats'], 'non-loss')}"


def table(results: dict[str, Any]) -> str:
    """Per recipe, per seed: the warm start's and the last checkpoint's scores; the mean change across seeds."""
    lines = []
    for name, recipe in results["recipes"].items():
        lines.append(f"{name}:")
        for seed, result in recipe["seeds"].items():
            lines.append(f"  seed {seed} warm start: {scores_text(result, result['warm_start'])}")
            rl = result["curve"][-1]
            spent = f"RL {rl['seconds'] or 0:.0f} s, {rl['generated_tokens'] or 0:,} tokens"
            cost = f"{result['seconds']:.0f} s in all; {spent}"
            lines.append(f"  seed {seed} after RL  : {scores_text(result, result['final'])} ({cost})")
        if "summary" in recipe:
            across = recipe["summary"]
            low, high = across["mean_change_ci"]
            what = (
                "exploitability"
                if next(iter(recipe["seeds"].values()))["game"] == "KuhnPoker"
                else "win rate vs random"
            )
            lines.append(f"  mean change of the {what}: {across['mean_change']:+.3f} [{low:+.3f}, {high:+.3f}] (95% t)")
    return "\n".join(lines)


def plot(name: str, seeds: dict[str, dict[str, Any]], path: Path) -> None:
    """The recipe's curve over learner steps, one line per seed: TicTacToe's win rate against random (95% Wilson
    bars), or Kuhn Poker's exploitability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for seed, result in seeds.items():
        curve = result["curve"]
        steps = [p["step"] for p in curve]
        if result["game"] == "KuhnPoker":
            ax.plot(steps, [p["exploitability"] for p in curve], "o-", label=f"seed {seed}")
            ax.set(title=f"Kuhn Poker, {name}", xlabel="learner step", ylabel="exploitability (chips/round)")
            continue
        rates = [p["win_rate"] for p in curve]
        errors = [
            [r - p["win_ci"][0] for r, p in zip(rates, curve)],
            [p["win_ci"][1] - r for r, p in zip(rates, curve)],
        ]
        ax.errorbar(steps, rates, yerr=errors, marker="o", capsize=3, label=f"seed {seed}: vs random")
        ax.set(title=f"TicTacToe win rate, {name} (95% CI)", xlabel="learner step", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags; `--smoke` adds `SMOKE` before `--set` and cuts the evaluations to a few games."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", type=Path, default=RECIPES, help="config files (default: RECIPES)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run of each recipe per seed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    parser.add_argument("--eval-games", type=int, default=400, help="per opponent: 95%% intervals about +-0.05")
    parser.add_argument("--curve-points", type=int, default=4, help="curve intervals between step 0 and the last")
    parser.add_argument("--curve-games", type=int, default=100, help="TicTacToe's games per curve point")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the evaluations")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    parser.add_argument("--runs-dir", default="runs/benchmark-learning", help="the runs go to RUNS_DIR/seed-N/")
    parser.add_argument("--smoke", action="store_true", help="seed 0, 2 learner steps, a few games (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.set = [0], [*SMOKE, *args.set]
        args.eval_games, args.curve_points, args.curve_games = 2, 1, 2
    return args


def plot_cost(recipes: dict[str, Any], path: Path) -> None:
    """Every recipe's curves against what RL spent: TicTacToe's win rate against random (Kuhn Poker's
    exploitability) over wall seconds, and over generated tokens; one line per recipe and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (name, recipe), color in zip(recipes.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        for n, result in enumerate(recipe["seeds"].values()):
            curve = [p for p in result["curve"] if p["seconds"] is not None]
            score = "exploitability" if result["game"] == "KuhnPoker" else "win_rate"
            for ax, cost in zip(axes, ("seconds", "generated_tokens")):
                label = name if n == 0 else None
                ax.plot([p[cost] for p in curve], [p[score] for p in curve], "o-", color=color, label=label)
    axes[0].set(xlabel="RL wall seconds", ylabel="win rate vs random (Kuhn Poker: exploitability)")
    axes[1].set(xlabel="tokens generated in training games")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Every recipe over every seed; writes the JSON and PNGs after each seed (a crash keeps what ran), prints the
    table; returns the results."""
    args = parse_args(argv)
    for path in args.recipes:  # every recipe and override is checked before any training
        game_of(recipe_config(path, args.seeds[0], args), path)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "settings": settings(args),
        "recipes": {},
    }
    for seed in args.seeds:  # seed by seed, so recipes compared in one run meet the same machine conditions
        for path in args.recipes:
            recipe = results["recipes"].setdefault(path.stem, {"path": str(path), "seeds": {}})
            recipe["seeds"][str(seed)] = run_seed(path, seed, args)
            recipe["summary"] = summary(recipe["seeds"])
            plot(path.stem, recipe["seeds"], args.out / f"learning-{path.stem}.png")
            results["wall_seconds"] = time.time() - start
            (args.out / "learning.json").write_text(json.dumps(results, separators=(",", ":")) + "\n")
        plot_cost(results["recipes"], args.out / "learning-cost.png")
    print(table(results))
    print(f"wall time: {results['wall_seconds']:.0f}s; results in {args.out}")
    return results


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a bad recipe, override or flag: one line, before any training
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
