"""End-to-end loop throughput: the whole Ray run (collector + inference + learner) against the bare backend.

Runs `unstable.runtime.train` on the tiny model for a few learner steps and reports finished games/s,
generated tokens/s, learner seconds/step, the prefix cache's hit rate and peak memory of the whole process tree;
then times the bare inference backend alone at the same batch size, so the loop's overhead is visible
(`experiments/peer-unstablebaselines-0.2.2.md` measured UnstableBaselines at 178 tok/s vs 1,797 for bare vLLM).
With `--routing` it instead runs the loop with 2 inference actors once per `inference.routing` (least outstanding,
then by game) and compares the two. With `--scale` it runs the loop with 1 and 2 learners x 1 and 2 inference actors
(4 runs, one at a time, the same steps and games in flight) and compares games/s, learner tokens/s and the balance
of each (the share of the time the learner waited for data, the share of game-slot time pacing held collection
back, the run's recommendation: `unstable.tracking.balance`). Devices come from the config: on GPUs give them with
`--set`, e.g. `--set learner.num_gpus=1 --set inference.num_gpus=1` (4 GPUs for the 2 x 2 run).

    python benchmarks/loop.py [--backend transformers|vllm] [--steps 6] [--workers 16] [--out FILE]
    python benchmarks/loop.py --routing [--steps 20] [--workers 16] [--out benchmarks/results/routing.json]
    python benchmarks/loop.py --scale [--steps 12] [--workers 16] [--set KEY=VALUE ...]
        [--out benchmarks/results/scaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

from footprint import tree_rss
from recorded import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parent.parent


class PeakMemory:
    """Samples the summed RSS of this process and all its descendants (Ray's processes included)."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss())
            self._stop.wait(self.interval_s)


def loop_overrides(args, workers: int, steps: int, *mode: str) -> list[str]:
    """This benchmark's settings over the demo config: the UnstableBaselines peer's run
    (experiments/peer-unstablebaselines-0.2.2.md), then a mode's own (`mode`), then the user's `--set`."""
    return [
        f"learner.num_steps={steps}",
        f"collector.num_workers={workers}",
        "collector.num_eval_workers=0",
        "evaluation.games_at_start=0",
        "evaluation.games_at_end=0",
        f"inference.backend={args.backend}",
        f"inference.max_new_tokens={args.max_new_tokens}",
        f"inference.max_batch_size={max(workers, 1)}",
        f"learner.batch_size={args.batch_size}",
        # the UnstableBaselines peer's setting (experiments/peer-unstablebaselines-0.2.2.md): the random-weight model,
        # LoRA, mirror self-play, one learner
        "warm_start=null",
        "learner.policy.lora={lora_rank: 16, lora_alpha: 32}",
        "learner.num_learners=1",
        "learner.optimizer.learning_rate=1e-4",
        "learner.optimizer.warmup_steps=0",
        "learner.algorithm.args={}",
        "pool.sample_mode=mirror",
        "pool.fixed_opponents=[]",
        "pool.rating_anchor=null",  # the demo anchors its ratings on the fixed opponent this run drops
        "pool.max_active_lora=3",
        "buffer.max_buffer_size=512",
        "run.name=bench-loop",
        f"run.dir={args.run_dir}",
        *mode,
        *args.set,  # last, so they win: the devices of a GPU machine, another model
    ]


def run_loop(args, workers: int, steps: int) -> dict:
    """The demo config with `loop_overrides`, measured by `measure_loop`."""
    from unstable.config import load_config

    return measure_loop(load_config(ROOT / "examples" / "tictactoe-tiny.yaml", loop_overrides(args, workers, steps)))


def concurrency_run(args, workers: int, main_loop: dict) -> dict:
    """The loop at `workers` games in flight for `--scaling`, over `--steps // 2` learner steps (at least 3); the main
    loop's own result where it ran with those same settings (an identical run is not repeated)."""
    steps = max(args.steps // 2, 3)
    return main_loop if (workers, steps) == (args.workers, args.steps) else run_loop(args, workers, steps)


def warm_up_end(rows: list[dict]) -> int:
    """The index of the row that ends the loop's warm-up: learner step 1's (Ray start, model load, the first batch),
    or the last of the rows without a generated token right after it, when the engine paused there (a compiled
    engine compiles its step again when the first adapter arrives) and served again before the run ended."""
    from unstable.tracking import keys

    first = next(i for i, r in enumerate(rows) if r.get(keys.STEP) == 1)
    end = first
    while end + 1 < len(rows) and rows[end + 1].get(keys.INFERENCE_GENERATED_TOKENS, 0) == 0:
        end += 1
    return end if end + 1 < len(rows) else first


def measure_loop(cfg) -> dict:
    """The whole loop of `cfg` (`unstable train`) on Ray. Throughput counts every game and token after the warm-up
    (`warm_up_end`) up to the last row; the first learner step's time counts from the call. `cfg` needs at least 2
    learner steps."""
    from unstable.runtime import train
    from unstable.tracking import keys
    from unstable.tracking.balance import recommendation, run_balance

    rows, arrived = [], []
    start = time.perf_counter()

    def on_row(row):
        rows.append(row)
        arrived.append(time.perf_counter() - start)

    with PeakMemory() as memory:
        summary = train(cfg, on_row=on_row)
    first = next(i for i, r in enumerate(rows) if r.get(keys.STEP) == 1)
    warm = warm_up_end(rows)
    steady = rows[warm + 1 :]
    seconds = arrived[-1] - arrived[warm]
    steps = cfg.learner.num_steps
    updates = [r for r in steady if keys.UPDATE_SECONDS in r]
    balance = run_balance(rows)  # over the steps after the first (the window above may start later)
    return {
        "workers": cfg.collector.num_workers,
        "load_average": os.getloadavg()[0],  # the machine's 1-minute load when the run ended
        "wall_s": time.perf_counter() - start,
        "first_learner_step_s": arrived[first],
        "paused_after_first_step_s": arrived[warm] - arrived[first],  # the engine serving nothing after step 1
        "games_per_s": sum(r["collector/train_games"] for r in steady) / seconds,
        "tokens_per_s": sum(r[keys.INFERENCE_GENERATED_TOKENS] for r in steady) / seconds,
        "mean_batch": statistics.mean(r["inference/mean_batch_size"] for r in steady),
        "prefix_cache_hit_rate": sum(r[keys.INFERENCE_CACHED_PROMPT_TOKENS] for r in steady)
        / max(sum(r[keys.INFERENCE_PROMPT_TOKENS] for r in steady), 1),
        "requests_by_actor": [sum(served) for served in zip(*(r[keys.INFERENCE_REQUESTS_BY_ACTOR] for r in steady))],
        "learner_s_per_step": statistics.mean(r[keys.UPDATE_SECONDS] for r in updates),
        # from an update's end until its policy was servable (handed to the engines, or its folder written)
        "weight_sync_seconds": statistics.mean(r[keys.WEIGHT_SYNC_SECONDS] for r in updates),
        # the whole batch's tokens over the update's seconds (with several learners: rank 0's), over every update
        "learner_tokens_per_s": sum(r[keys.TRAIN_TOKENS_PER_S] * r[keys.UPDATE_SECONDS] for r in updates)
        / sum(r[keys.UPDATE_SECONDS] for r in updates),
        "learner_wait_share": balance.learner_wait_share,
        "held_back_share": balance.held_back_share,
        "recommendation": recommendation(balance),
        "peak_rss_gb": memory.peak_bytes / 1e9,
        "last_checkpoint": str(Path(summary.run_dir) / "checkpoints" / f"ckpt-{steps}"),
        # every row as it arrived: to find where a start cost (a compile, say) ended after the run
        "timeline": [
            {"s": s, "learner_step": r.get(keys.STEP), "tokens": r.get(keys.INFERENCE_GENERATED_TOKENS, 0)}
            for s, r in zip(arrived, rows)
        ],
    }


ROUTINGS = ("least_outstanding", "game")


def run_routing(args) -> dict:
    """The loop of `run_loop` with 2 inference actors, once per `inference.routing`; the ratios are by game over
    least outstanding."""
    from unstable.config import load_config

    runs = {}
    for routing in ROUTINGS:
        mode = ["inference.num_actors=2", f"inference.routing={routing}", f"run.name=bench-routing-{routing}"]
        overrides = loop_overrides(args, args.workers, args.steps, *mode)
        runs[routing] = measure_loop(load_config(ROOT / "examples" / "tictactoe-tiny.yaml", overrides))
    by_game, least = runs["game"], runs["least_outstanding"]
    ratios = {k: by_game[k] / least[k] for k in ("prefix_cache_hit_rate", "tokens_per_s", "games_per_s")}
    return {"backend": args.backend, "settings": settings(args), "runs": runs, "game_over_least_outstanding": ratios}


def print_routing(result: dict) -> None:
    """The routing comparison as a table."""
    print(f"{'routing':<20}{'hit rate':>10}{'tok/s':>10}{'games/s':>10}  requests by actor")
    for routing, run in result["runs"].items():
        hit, tokens, games = run["prefix_cache_hit_rate"], run["tokens_per_s"], run["games_per_s"]
        print(f"{routing:<20}{hit:>10.3f}{tokens:>10.1f}{games:>10.2f}  {run['requests_by_actor']}")


SCALES = ((1, 1), (1, 2), (2, 1), (2, 2))  # (learner.num_learners, inference.num_actors)


def run_scale(args) -> dict:
    """The loop of `run_loop` once per pair of `args.scales` (default `SCALES`), one at a time, with the same steps and
    games in flight."""
    from unstable.config import load_config

    runs = {}
    for learners, actors in args.scales:
        name = f"{learners}x{actors}"
        scale = [f"learner.num_learners={learners}", f"inference.num_actors={actors}", f"run.name=bench-scale-{name}"]
        cfg = load_config(
            ROOT / "examples" / "tictactoe-tiny.yaml", loop_overrides(args, args.workers, args.steps, *scale)
        )
        runs[name] = {"learners": learners, "inference_actors": actors} | measure_loop(cfg)
    return {"backend": args.backend, "settings": settings(args), "runs": runs}


def scale_pair(text: str) -> tuple[int, int]:
    """`--scales`' `LxA`: learners and inference actors, each at least 1."""
    try:
        learners, actors = (int(part) for part in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LEARNERSxACTORS, e.g. 2x1") from None
    if min(learners, actors) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1 learner and 1 inference actor")
    return learners, actors


def print_scale(result: dict) -> None:
    """The runs of `run_scale` as a table, each with its recommendation."""
    print(f"{'learners x actors':<19}{'games/s':>9}{'learner tok/s':>15}{'learner wait':>14}{'held back':>11}  advice")
    for name, run in result["runs"].items():
        games, tokens = run["games_per_s"], run["learner_tokens_per_s"]
        wait, held = run["learner_wait_share"], run["held_back_share"]
        print(f"{name:<19}{games:>9.2f}{tokens:>15.0f}{wait:>14.0%}{held:>11.0%}  {run['recommendation']}")


def run_bare(args, batch: int, adapter: str | None = None) -> dict:
    """The bare tiny-model backend of `args.backend` on `args.bare_rounds` batches of game prompts (`measure_bare`)."""
    from unstable.inference import InferenceConfig, make_backend
    from unstable.models.tiny import ensure_tiny_model

    model = str(ensure_tiny_model(ROOT / ".cache" / "tiny-qwen3"))
    backend = make_backend(model, InferenceConfig(backend=args.backend, max_new_tokens=args.max_new_tokens))
    try:
        prompts = game_prompts(backend.tokenizer, (args.bare_rounds + 1) * batch)
        return measure_bare(backend, prompts, batch, adapter)
    finally:
        backend.close()


def game_prompts(tokenizer, count: int, openings_only: bool = False) -> list[str]:
    """`count` real TicTacToe prompts: observations of random-vs-random games rendered with the loop's template, so
    prompt lengths match the loop's. With `openings_only`, the first one (the same in every game) `count` times:
    all a random-weight model's loop serves, since TicTacToe ends a game after an invalid answer and one retry."""
    from unstable.collector.demonstrations import generate_sft_steps
    from unstable.records import EnvSpec

    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    games = 1 if openings_only else count // 5 + 1  # a TicTacToe game has at least 5 moves
    steps = generate_sft_steps(spec, ["random", "random"], games, tokenizer, seed=0)[: 1 if openings_only else None]
    return [steps[i % len(steps)].prompt for i in range(count)]


def measure_bare(backend, prompts: list[str], batch: int, adapter: str | None = None) -> dict:
    """The bare backend, no Ray, no games: `prompts` in back-to-back batches of `batch` (the first a warm-up, an
    incomplete last one left out), served by the base model or, with `adapter`, by that LoRA checkpoint (the loop
    serves its learner's adapters)."""
    from unstable.records import Checkpoint, GenerationRequest

    checkpoint = Checkpoint("bench-adapter", adapter) if adapter else None
    if checkpoint:
        backend.load_adapter(checkpoint)
    batches = [
        [GenerationRequest(p, checkpoint) for p in prompts[i : i + batch]] for i in range(0, len(prompts), batch)
    ]
    batches = [b for b in batches if len(b) == batch]
    backend.generate(batches[0])  # warm-up
    tokens, start = 0, time.perf_counter()
    for requests in batches[1:]:
        tokens += sum(len(r.completion_token_ids) for r in backend.generate(requests))
    elapsed = time.perf_counter() - start
    if checkpoint:
        backend.unload_adapter(checkpoint.uid)
    return {"batch": batch, "adapter": adapter, "rounds": len(batches) - 1, "tokens_per_s": tokens / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--bare-rounds", type=int, default=10)
    parser.add_argument(
        "--scaling",
        type=int,
        nargs=2,
        default=[1, 64],
        metavar=("FEW", "MANY"),
        help="games in flight of the concurrency comparison (learner steps: --steps // 2)",
    )
    parser.add_argument("--run-dir", default="runs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, last")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--routing", action="store_true", help="compare inference.routing over 2 inference actors")
    mode.add_argument("--scale", action="store_true", help="1 and 2 learners x 1 and 2 inference actors")
    parser.add_argument(
        "--scales",
        type=scale_pair,
        nargs="+",
        default=list(SCALES),
        metavar="LxA",
        help="with --scale: the runs, each learners x inference actors (default: 1x1 1x2 2x1 2x2)",
    )
    parser.add_argument("--out", help="default: benchmarks/results/loop.json (routing.json, scaling.json)")
    args = parser.parse_args()
    default = "routing" if args.routing else "scaling" if args.scale else "loop"
    args.out = args.out or f"benchmarks/results/{default}.json"
    if args.routing or args.scale:
        run, show = (run_routing, print_routing) if args.routing else (run_scale, print_scale)
        result = run(args)
        write_result(result, args.out)
        show(result)
        return

    loop = run_loop(args, args.workers, args.steps)
    # the engine alone with as many requests as the loop has games: on the base model, and on the run's adapter
    bare = run_bare(args, batch=args.workers)
    bare_lora = run_bare(args, batch=args.workers, adapter=loop["last_checkpoint"])
    few, many = (concurrency_run(args, n, loop) for n in args.scaling)
    result = {
        "backend": args.backend,
        "settings": settings(args),
        "loop": loop,
        "bare": bare,
        "bare_lora": bare_lora,
        "loop_over_bare": loop["tokens_per_s"] / bare["tokens_per_s"],
        "loop_over_bare_lora": loop["tokens_per_s"] / bare_lora["tokens_per_s"],
        "scaling": {"few": few, "many": many, "games_per_s_ratio": many["games_per_s"] / few["games_per_s"]},
    }
    write_result(result, args.out)
    print(f"{'measure':<36}{'value':>12}")
    for key, value in [
        (f"loop games/s @ {args.workers}", loop["games_per_s"]),
        (f"loop generated tok/s @ {args.workers}", loop["tokens_per_s"]),
        ("loop mean rows per forward", loop["mean_batch"]),
        ("learner s/step", loop["learner_s_per_step"]),
        ("weight sync s/step", loop["weight_sync_seconds"]),
        ("first learner step s (from call)", loop["first_learner_step_s"]),
        ("peak RSS GB (all procs)", loop["peak_rss_gb"]),
        (f"bare engine tok/s @ {bare['batch']}, base", bare["tokens_per_s"]),
        (f"bare engine tok/s @ {bare['batch']}, LoRA", bare_lora["tokens_per_s"]),
        ("loop / bare (base)", result["loop_over_bare"]),
        ("loop / bare (LoRA)", result["loop_over_bare_lora"]),
        (f"games/s @ {args.scaling[0]} in flight", few["games_per_s"]),
        (f"games/s @ {args.scaling[1]} in flight", many["games_per_s"]),
        (f"games/s ratio {args.scaling[1]} / {args.scaling[0]}", result["scaling"]["games_per_s_ratio"]),
    ]:
        print(f"{key:<36}{value:>12.2f}")
    print(f"wrote {args.out}")


def write_result(result: dict, out: str) -> None:
    """`result` as JSON at `out` (its folder made), with this machine's CPU count."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result | {"cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
