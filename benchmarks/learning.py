"""Learning benchmark: does self-play RL make the tiny model play better than its warm start?

TicTacToe: the tiny model is warm-started by SFT on the moves of the random agent (random vs random games, so
it learns the answer format and, at best, which moves are legal, but no strategy), evaluated against the
random agent and minimax, trained with `unstable.runtime.train` against the pool (by default three games in four
against the random agent and one against minimax; `--self-play` adds mirror self-play, `--train-opponent mirror` is
self-play only; Reinforce without a KL penalty: `RECIPE_ARGS`; rewards z-scored per opponent: `RECIPE_BASELINE`; lr
4e-4 after 10 warm-up updates, 128 steps per update), and evaluated again at saved checkpoints.
Kuhn Poker (`KuhnPoker-v0-single`: one hand per game, rewarded in chips): warm-started by SFT on the equilibrium's
moves (`--kuhn-sft-agent random` for random moves, from which every RL variant stayed card-blind), trained by mirror
self-play (`--kuhn-train-opponent`; Reinforce with a KL penalty to the warm start), with the exact exploitability of
the model's policy measured at saved checkpoints.

Writes `learning.json` and one `learning-<algorithm>.png` per algorithm under `--out-dir` (checkpoints go to
`--runs-dir`) and prints a table.
Run on demand (never from tests):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/learning.py                  # Reinforce, seeds 0, 1, 2
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/learning.py --all-algorithms # every RL algorithm
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/learning.py --finetune lora --sample-mode lagged  # population
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/learning.py --games kuhn --seeds 1 --algorithm-args '{}'  # no KL
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from unstable.agents.scripted import make_scripted_agent  # noqa: E402
from unstable.algorithms import ALGORITHMS  # noqa: E402
from unstable.buffer.config import BufferConfig  # noqa: E402
from unstable.collector.demonstrations import generate_sft_steps  # noqa: E402
from unstable.config.schema import validate_config  # noqa: E402
from unstable.evaluation.evaluate import evaluate, kuhn_exploitability  # noqa: E402
from unstable.games.kuhn import kuhn_information_sets  # noqa: E402
from unstable.inference import InferenceConfig  # noqa: E402
from unstable.learner import LearnerConfig, LoraConfig  # noqa: E402
from unstable.learner.sft import run_sft  # noqa: E402
from unstable.models.tiny import ensure_tiny_model  # noqa: E402
from unstable.pool.config import PoolConfig  # noqa: E402
from unstable.records import EnvSpec  # noqa: E402
from unstable.runtime import train  # noqa: E402
from unstable.tracking import keys  # noqa: E402
from unstable.tracking.history import latest_value, read_rows  # noqa: E402
from unstable.tracking.stats import mean_interval  # noqa: E402

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
KUHN = EnvSpec("KuhnPoker-v0-single-train", 2, "qwen3-zs")
SPECS = {"tictactoe": TICTACTOE, "kuhn": KUHN}
OPPONENTS = {TICTACTOE: ["random", "tictactoe-minimax"], KUHN: ["random", "kuhn-nash"]}
# The default recipe per game (docs/learning.md, "The learning benchmark's recipe"), with the settings defaults below
# (TicTacToe: lr 4e-4 after 10 warm-up updates, decayed by a cosine over the run's 250 steps; Kuhn Poker: 2e-4 over
# 60): Kuhn Poker's Reinforce is held near its equilibrium warm start by a KL penalty; TicTacToe's runs without one
# (against the random agent the penalty only held the policy near its random-move warm start). The other algorithms
# run with their defaults.
RECIPE_ARGS = {(KUHN, "reinforce"): {"ref_kl_coef": 0.1}}
# The batch baseline per game when `--baseline` names none: TicTacToe's RL games mix opponents, so its rewards are
# z-scored per opponent (a draw against minimax counts above a loss to it, not below the wins against random);
# Kuhn Poker's mirror games z-score per env (per opponent, every checkpoint would be a group of its own).
RECIPE_BASELINE = {TICTACTOE: "opponent", KUHN: "env"}
BASELINES = ("env", "opponent", "observation", "env-role", "opponent-role", "opponent-center", "opponent-role-center")
# The tiny model's random embeddings are too small for sharp logits; a LoRA on the (tied) output layer fixes that.
LORA_TARGETS = [*LoraConfig().target_modules, "lm_head"]


@dataclass
class Settings:
    """Every knob of the benchmark (each is also a command-line flag, `_` written as `-`)."""

    out_dir: str = "benchmarks/results"
    runs_dir: str = "runs/benchmark-learning"
    model_dir: str = ".cache/tiny-qwen3"
    seed: int = 0
    seeds: int = 3  # independent runs (warm start, RL, evaluation) with seeds seed, seed+1, ...
    threads: int = os.cpu_count() or 1  # SFT and evaluation; in RL the learner and inference get half each
    finetune: str = "full"
    # TicTacToe's RL games are against these scripted agents (comma-separated, drawn with equal odds per game);
    # "mirror": self-play only. Against the random agent alone the policy wins more often but loses to minimax more;
    # the recipe plays three games in four against random, one against minimax.
    train_opponent: str = "random,random,random,tictactoe-minimax"
    self_play: bool = False  # True: the newest checkpoint (mirror self-play) is drawn as one more opponent
    sample_mode: str = ""  # a pool sampling mode: population play among the learner's checkpoints (overrides the above)
    pool_size: int = 4  # with --sample-mode: checkpoints kept active (lagged: the pool_size - 1 before the latest)
    temperature: float = 1.0
    max_new_tokens: int = 8
    lora_rank: int = 16
    sft_games: int = 800
    sft_agent: str = "random"  # the scripted agent whose moves (both seats) the TicTacToe warm start imitates
    sft_epochs: int = 2
    sft_batch_size: int = 16
    sft_lr: float = 1e-3
    rl_steps: int = 250
    # TicTacToe's (Kuhn Poker: kuhn_rl_batch_size); at 64, recipes that won more against random had a seed settle
    # early on a favourite corner that minimax beats; at 128 six seeds of six opened in the center
    # (experiments/log.md, "Across seeds: branched games, a favourite cell, and a batch of 128")
    rl_batch_size: int = 128
    # TicTacToe's (Kuhn Poker: kuhn_rl_lr); at 6e-4 without warm-up, 7 of 16 seeds' valid-answer rate fell below 0.9
    rl_lr: float = 4e-4
    rl_lr_schedule: str = "cosine"  # learner.lr_schedule: constant, linear or cosine (to rl_min_lr_ratio)
    rl_min_lr_ratio: float = 0.0
    rl_warmup_steps: int = 10  # learner.warmup_steps: TicTacToe's updates of linear warm-up before the schedule
    rl_workers: int = 32
    group_size: int = 4
    algorithm_args: str = ""  # the RL algorithm's keyword arguments as JSON ("": RECIPE_ARGS), e.g. '{"epochs": 4}'
    games: str = "tictactoe,kuhn"  # which games to run, comma-separated
    # the batch baseline ("": RECIPE_BASELINE): "env" z-scores rewards per env; "opponent" per env and opponent
    # (NormalizeRewardsByOpponent); "observation": BaselineByObservation (a per-state baseline), then per env;
    # "-role" also per seat (`by_role`); "-center": each group's mean subtracted, then one std per env
    baseline: str = ""
    discount: float = 1.0  # buffer.discount: a move's reward is the result times discount ** (its later moves)
    select_window: int = 0  # > 0: evaluate the best checkpoint by training games vs the scripted agent (see select)
    warm_runs_dir: str = ""  # reuse the SFT warm starts saved under this --runs-dir (per seed) when present
    kuhn_sft_games: int = 400
    kuhn_sft_agent: str = "kuhn-nash"  # the scripted agent whose moves (both seats) the Kuhn warm start imitates
    kuhn_train_opponent: str = "mirror"  # as --train-opponent, for Kuhn Poker
    kuhn_rl_steps: int = 60
    kuhn_rl_lr: float = 2e-4  # near its equilibrium warm start, self-play's large steps swing it into bluffing
    kuhn_rl_batch_size: int = 64
    kuhn_rl_warmup_steps: int = 0  # as rl_warmup_steps, for Kuhn Poker
    eval_games: int = 400  # per opponent: 95% intervals about +-0.05
    curve_points: int = 4
    curve_games: int = 100

    def __post_init__(self):
        if self.finetune not in ("full", "lora"):
            raise ValueError(f"--finetune must be 'full' or 'lora', got {self.finetune!r}")
        for agent in [*self.opponents(TICTACTOE), *self.opponents(KUHN), self.sft_agent, self.kuhn_sft_agent]:
            make_scripted_agent(agent, seed=0)  # an unknown name fails before any training
        BufferConfig(discount=self.discount)  # a discount outside (0, 1] fails before any training
        if self.baseline not in ("", *BASELINES):
            raise ValueError(f"--baseline must be one of {', '.join(BASELINES)}, got {self.baseline!r}")
        if not set(self.game_names) <= {"tictactoe", "kuhn"}:
            raise ValueError(f"--games must name tictactoe and/or kuhn, got {self.games!r}")
        json.loads(self.algorithm_args or "{}")  # malformed JSON fails before any training
        if self.sample_mode:
            PoolConfig(**self.pool(TICTACTOE))  # an unknown mode or a bad pool size fails before any training
            if self.full:
                raise ValueError("--sample-mode plays past checkpoints, which needs --finetune lora")

    def algorithm_kwargs(self, spec: EnvSpec, algorithm: str) -> dict[str, Any]:
        """`--algorithm-args`, or the default recipe's arguments for `algorithm` on `spec`'s game when none given."""
        return json.loads(self.algorithm_args) if self.algorithm_args else RECIPE_ARGS.get((spec, algorithm), {})

    def sampling_transforms(self, spec: EnvSpec) -> list[dict[str, Any]]:
        """The batch baseline of `--baseline` (or the recipe's for `spec`'s game): a z-score per env or per opponent,
        after a per-state baseline with "observation"."""
        baseline = self.baseline or RECIPE_BASELINE[spec]
        per_state = [{"name": "BaselineByObservation"}] if baseline == "observation" else []
        normalizer = "NormalizeRewardsByOpponent" if baseline.startswith("opponent") else "NormalizeRewardsByEnv"
        center = baseline.endswith("-center")
        group = {"name": normalizer, "args": {"z_score": not center, "by_role": "-role" in baseline}}
        scale = [{"name": "NormalizeRewardsByEnv", "args": {"z_score": True}}] if center else []
        return [*per_state, group, *scale]

    @property
    def game_names(self) -> list[str]:
        """The games of `--games`."""
        return [name.strip() for name in self.games.split(",") if name.strip()]

    @property
    def full(self) -> bool:
        """Whether SFT and RL train every weight (`--finetune full`) rather than a LoRA adapter."""
        return self.finetune == "full"

    def policy(self, model: str, checkpoint: str) -> tuple[str, str | None]:
        """(model path, adapter) that load `checkpoint`: a full model directory, or an adapter on `model`."""
        return (checkpoint, None) if self.full else (model, checkpoint)

    def batch_size(self, spec: EnvSpec) -> int:
        """The learner's batch (steps per update) in `spec`'s RL runs."""
        return self.kuhn_rl_batch_size if spec == KUHN else self.rl_batch_size

    def curve(self, spec: EnvSpec) -> list[int]:
        """The learner steps `spec`'s curve evaluates (0 is the warm start; TicTacToe's last is the final one)."""
        if spec == KUHN:
            return curve_steps(self.kuhn_rl_steps, self.curve_points * 2)
        return curve_steps(self.rl_steps, self.curve_points)

    def retention(self, spec: EnvSpec) -> dict[str, Any]:
        """learner.retention of `spec`'s RL runs: the curve's checkpoints and the last step's state (every step
        with `--select-window`, whose choice may fall on any of them): a 250-step seed keeps 32 MB, not 1.7 GB."""
        return {} if self.select_window else {"keep_last": 1, "keep_steps": self.curve(spec)}

    def opponents(self, spec: EnvSpec) -> list[str]:
        """The scripted agents `spec`'s RL games are played against (none: mirror self-play only)."""
        names = self.kuhn_train_opponent if spec == KUHN else self.train_opponent
        return [] if names == "mirror" else [name.strip() for name in names.split(",")]

    def pool(self, spec: EnvSpec) -> dict[str, Any]:
        """The pool section of `spec`'s RL runs."""
        opponents = self.opponents(spec)
        if self.sample_mode:
            lag = {"lag": self.pool_size - 1} if self.sample_mode == "lagged" else {}
            return {"sample_mode": self.sample_mode, "max_active_lora": self.pool_size, **lag}
        if not opponents:
            return {"sample_mode": "mirror"}
        # "random": each game draws the newest checkpoint (mirror) or one of the agents; "fixed": one of the agents
        return {
            "sample_mode": "random" if self.self_play else "fixed",
            "fixed_opponents": opponents,
            "max_active_lora": 1,
        }

    def opponents_label(self, spec: EnvSpec) -> str:
        """Who `spec`'s RL games are played against, in words."""
        opponents = self.opponents(spec)
        if self.sample_mode:
            return f"population play, sample_mode {self.sample_mode} over {self.pool_size} checkpoints"
        if not opponents:
            return "mirror self-play"
        drawn = ["mirror self-play"] * self.self_play + opponents
        return (
            f"each game against one of {', '.join(drawn)} (equal odds)"
            if len(drawn) > 1
            else f"every game against {drawn[0]}"
        )

    @property
    def inference(self) -> InferenceConfig:
        """How every evaluation samples (the training temperature) and its threads."""
        return InferenceConfig(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, num_threads=self.threads
        )


def lora_cfg(s: Settings) -> dict[str, Any]:
    """The LoRA shape of `--finetune lora`: rank `lora_rank` on the projections and the output layer."""
    return {"lora_rank": s.lora_rank, "lora_alpha": 2 * s.lora_rank, "target_modules": LORA_TARGETS}


def warm_start(spec: EnvSpec, games: int, agent: str, model: str, s: Settings) -> dict[str, Any]:
    """SFT on the moves of `agent` playing itself in `spec`; returns the checkpoint path and the seconds it took."""
    from transformers import AutoTokenizer

    start = time.time()
    name = f"sft-{spec.env_id}" if agent == "random" else f"sft-{spec.env_id}-{agent}"
    saved = Path(s.warm_runs_dir, f"seed-{s.seed}", name, "checkpoints")
    reuse = sorted(saved.glob("ckpt-*")) if s.warm_runs_dir else []
    if reuse:
        print(f"  sft {spec.env_id}: reusing {reuse[-1]}", flush=True)
        return {"checkpoint": str(reuse[-1]), "moves": None, "seconds": 0.0, "reused": True}
    steps = generate_sft_steps(spec, [agent, agent], games, AutoTokenizer.from_pretrained(model), seed=s.seed)
    cfg = LearnerConfig(
        batch_size=s.sft_batch_size,
        learning_rate=s.sft_lr,
        lora=None if s.full else lora_cfg(s),
        num_threads=s.threads,
    )
    checkpoint = run_sft(
        model,
        steps,
        cfg,
        out_dir=str(Path(s.runs_dir) / name),
        epochs=s.sft_epochs,
        seed=s.seed,
        on_epoch=lambda row: print(f"  sft {spec.env_id} epoch {row['epoch']}: loss {row['loss']:.4f}", flush=True),
    )
    return {"checkpoint": checkpoint, "moves": len(steps), "seconds": time.time() - start}


def rl_config(spec: EnvSpec, algorithm: str, warm: str, steps: int, model: str, s: Settings) -> dict[str, Any]:
    """The RunConfig (as a dict) of RL from the warm-start checkpoint `warm`."""
    base, adapter = s.policy(model, warm)
    return {
        "run": {"name": f"rl-{spec.env_id}-{algorithm}", "dir": s.runs_dir, "seed": s.seed},
        "model": {"path": base},
        "inference": {
            "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "num_threads": max(1, s.threads // 2),
            "max_loras": 8,  # games in flight may still play several recent checkpoints
        },
        "collector": {
            "num_workers": s.rl_workers,
            "max_turns": 30,
            "training_envs": [list(asdict(spec).values())],
            # the group baseline needs groups: each game branches into G continuations at one decision
            "group_size": s.group_size if algorithm == "group_baseline" else 1,
        },
        "pool": s.pool(spec) | {"max_retired": steps},  # every checkpoint stays in the match matrix `select` reads
        "buffer": {
            "max_buffer_size": 2 * s.batch_size(spec),
            "discount": s.discount,
            # the env's own rewards: TicTacToe +1/0/-1, single-hand Kuhn Poker the chips won (+-1, +-2)
            "final_reward_transforms": [],
            # a rejected move is penalised itself (TextArena lets it retry, so the game result may be a win)
            "step_reward_transforms": [{"name": "PenaltyForInvalidMove", "args": {"penalty": -1.0}}],
            # a batch baseline: without it Reinforce's mostly negative rewards destroyed the answer format
            "sampling_reward_transforms": s.sampling_transforms(spec),
        },
        "learner": {
            "num_steps": steps,
            "batch_size": s.batch_size(spec),
            "learning_rate": s.kuhn_rl_lr if spec == KUHN else s.rl_lr,
            "lr_schedule": s.rl_lr_schedule,
            "min_lr_ratio": s.rl_min_lr_ratio,
            "warmup_steps": s.kuhn_rl_warmup_steps if spec == KUHN else s.rl_warmup_steps,
            "lora": None if s.full else lora_cfg(s),
            "initial_lora_path": adapter,
            "num_threads": max(1, s.threads // 2),
            "retention": s.retention(spec),
            "algorithm": {"name": algorithm, "args": s.algorithm_kwargs(spec, algorithm)},
        },
        "evaluation": {"games_at_start": 0, "games_at_end": 0},
        "tracker": {"wandb": "disabled", "tensorboard": False},  # metrics.jsonl only: no extra processes
    }


def train_rl(spec: EnvSpec, algorithm: str, warm: str, steps: int, model: str, s: Settings) -> dict[str, Any]:
    """Run RL; returns the run directory, a checkpoint path per step, the training rows and the seconds."""
    print(f"  {spec.env_id}: {algorithm}, {s.opponents_label(spec)}", flush=True)
    start = time.time()
    rows: list[dict[str, Any]] = []
    config = validate_config(rl_config(spec, algorithm, warm, steps, model, s))
    summary = train(config, on_row=rows.append)
    kept = [k for k in range(1, steps + 1) if config.learner.retention.keeps(k, steps)]
    checkpoints = {0: warm} | {k: f"{summary.run_dir}/checkpoints/ckpt-{k}" for k in kept}
    keep = ("learner/step", "time", "learner/mean_reward", "collector/format_ok_rate", "collector/invalid_move_rate")
    keep += (keys.REF_KL,)
    return {
        "match_matrix": latest_value(read_rows(summary.run_dir), keys.POOL_MATCH_MATRIX, {}),  # rows carry no tables
        "run_dir": summary.run_dir,
        "checkpoints": checkpoints,
        "train_games": summary.train_games,
        "rows": [{k: row[k] for k in keep if k in row} for row in rows],
        "seconds": time.time() - start,
    }


def select(matrix: dict[str, Any], steps: int, window: int, opponent: str) -> dict[str, Any]:
    """The checkpoint to evaluate: the last of the `window` consecutive checkpoints whose training games against
    `opponent` (the pool's match matrix; none of them is an evaluation game) won the largest share, among
    windows ending at step `window` or later (ties: the later one)."""
    best = {"step": steps, "win_rate": -1.0, "games": 0}
    for end in range(window, steps + 1):
        cells = [matrix.get(f"ckpt-{k}", {}).get(opponent) for k in range(end - window + 1, end + 1)]
        games = sum(c["games"] for c in cells if c)
        wins = sum(c["wins"] for c in cells if c)
        if games and wins / games >= best["win_rate"]:
            best = {"step": end, "win_rate": wins / games, "games": games}
    return best


def curve_steps(total: int, points: int) -> list[int]:
    """`points + 1` learner steps from 0 to `total`, evenly spaced."""
    return sorted({round(total * i / points) for i in range(points + 1)})


def outcome_point(step: int, report: dict[str, Any], opponent: str) -> dict[str, Any]:
    """One curve point: the all-seats W/D/L summary of `opponent` in `report`, tagged with the step."""
    result = report["opponents"][opponent]
    return {"step": step, **result["all_seats"], "valid_move_rate": result["valid_move_rate"]}


def evaluate_at(spec: EnvSpec, model: str, checkpoint: str, opponents: list[str], games: int, s: Settings):
    """`evaluate` of `checkpoint` with the benchmark's sampling, seed and threads."""
    base, adapter = s.policy(model, checkpoint)
    return evaluate(
        base,
        spec,
        opponents,
        adapter=adapter,
        games_per_opponent=games,
        inference=s.inference,
        seed=s.seed,
    )


def tictactoe(algorithm: str, warm: dict[str, Any], model: str, s: Settings) -> dict[str, Any]:
    """RL on TicTacToe, then the win-rate curve vs random and the final evaluation."""
    run = train_rl(TICTACTOE, algorithm, warm["checkpoint"], s.rl_steps, model, s)
    final = evaluate_at(TICTACTOE, model, run["checkpoints"][s.rl_steps], OPPONENTS[TICTACTOE], s.eval_games, s)
    curve = [outcome_point(0, warm["eval"], "random")]
    for step in s.curve(TICTACTOE)[1:-1]:
        report = evaluate_at(TICTACTOE, model, run["checkpoints"][step], ["random"], s.curve_games, s)
        curve.append(outcome_point(step, report, "random"))
    curve.append(outcome_point(s.rl_steps, final, "random"))
    result = {**run, "curve": curve, "final": final}
    if s.select_window:  # also the checkpoint chosen by its training games, with the final evaluation's games
        # by the games against the first scripted opponent (under mirror self-play none: the last checkpoint)
        opponent = next(iter(s.opponents(TICTACTOE)), "mirror")
        selected = select(run["match_matrix"], s.rl_steps, s.select_window, opponent)
        checkpoint = run["checkpoints"][selected["step"]]
        result["selected"] = selected | {
            "eval": evaluate_at(TICTACTOE, model, checkpoint, OPPONENTS[TICTACTOE], s.eval_games, s)
        }
    return result


def kuhn(algorithm: str, warm: dict[str, Any], model: str, infosets, s: Settings) -> dict[str, Any]:
    """RL on Kuhn Poker, exploitability at evenly spaced checkpoints, and the final evaluation."""
    run = train_rl(KUHN, algorithm, warm["checkpoint"], s.kuhn_rl_steps, model, s)
    curve = []
    for step in s.curve(KUHN):
        base, adapter = s.policy(model, run["checkpoints"][step])
        curve.append({"step": step, **kuhn_exploitability(base, KUHN, adapter, s.temperature, infosets)})
    final = evaluate_at(KUHN, model, run["checkpoints"][s.kuhn_rl_steps], OPPONENTS[KUHN], s.eval_games, s)
    return {**run, "curve": curve, "final": final}


def plot(name: str, per_seed: dict[str, dict[str, Any]], path: Path) -> None:
    """One panel per game that ran, over learner steps, one line per seed: TicTacToe win rate vs random (95% Wilson
    bars), Kuhn exploitability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = [game for game in SPECS if any(game in result for result in per_seed.values())]
    fig, axes = plt.subplots(1, len(games), figsize=(5.5 * len(games), 4), squeeze=False)
    panels = dict(zip(games, axes[0]))
    for seed, result in per_seed.items():
        if "kuhn" in result:
            kuhn_curve = result["kuhn"]["curve"]
            steps = [p["step"] for p in kuhn_curve]
            panels["kuhn"].plot(steps, [p["exploitability"] for p in kuhn_curve], "o-", label=f"seed {seed}")
        if "tictactoe" in result:
            curve = result["tictactoe"]["curve"]
            rates = [p["win_rate"] for p in curve]
            errors = [
                [r - p["win_ci"][0] for r, p in zip(rates, curve)],
                [p["win_ci"][1] - r for r, p in zip(rates, curve)],
            ]
            panels["tictactoe"].errorbar(
                [p["step"] for p in curve], rates, yerr=errors, marker="o", capsize=3, label=f"seed {seed}: vs random"
            )
    if "tictactoe" in panels:
        panels["tictactoe"].axhline(0.44, color="grey", linestyle=":", label="random vs random (0.44)")
        panels["tictactoe"].set(title=f"TicTacToe win rate, {name} (95% CI)", xlabel="learner step", ylim=(0, 1))
        panels["tictactoe"].legend(fontsize=8)
    if "kuhn" in panels:
        panels["kuhn"].axhline(0, color="grey", linestyle=":", label="equilibrium (0)")
        panels["kuhn"].axhline(1 / 3, color="grey", linestyle="--", label="always bet/call (1/3)")
        panels["kuhn"].legend(fontsize=8)
        panels["kuhn"].set(title=f"Kuhn Poker, {name}", xlabel="learner step", ylabel="exploitability (chips/round)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rate_text(wdl: dict[str, Any], key: str = "win") -> str:
    """An all-seats W/D/L summary's win rate (or, with key "non-loss", 1 - loss rate) and its 95% interval."""
    if key == "non-loss":
        low, high = wdl["loss_ci"]
        return f"{1 - wdl['loss_rate']:.2f} [{1 - high:.2f}, {1 - low:.2f}]"
    low, high = wdl["win_ci"]
    return f"{wdl['win_rate']:.2f} [{low:.2f}, {high:.2f}]"


def separated(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the win rate's 95% interval after RL lies wholly above the warm start's."""
    return after["win_ci"][0] > before["win_ci"][1]


def summary(results: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """Across seeds: each seed's TicTacToe win rate vs random before and after RL (with intervals), the mean
    change with its 95% t-interval, how many seeds separated, and the Kuhn exploitabilities after RL (each part
    only for the games that ran)."""
    per_seed, changes = {}, []
    for seed, run in results["seeds"].items():
        result = run["algorithms"].get(algorithm, {})
        row = per_seed.setdefault(seed, {})
        if "tictactoe" in result:
            before = run["warm_start"]["tictactoe"]["eval"]["opponents"]["random"]["all_seats"]
            after = result["tictactoe"]["final"]["opponents"]["random"]["all_seats"]
            changes.append(after["win_rate"] - before["win_rate"])
            row |= {
                "before": before["win_rate"],
                "before_ci": before["win_ci"],
                "after": after["win_rate"],
                "after_ci": after["win_ci"],
                "separated": separated(before, after),
            }
            if "selected" in result["tictactoe"]:
                chosen = result["tictactoe"]["selected"]
                row["selected"] = {"step": chosen["step"], **chosen["eval"]["opponents"]["random"]["all_seats"]}
        if "kuhn" in result:
            row["kuhn_after"] = result["kuhn"]["curve"][-1]["exploitability"]
    if not changes:
        return {"per_seed": per_seed}
    mean, low, high = mean_interval(changes)
    return {"per_seed": per_seed, "mean_change": mean, "mean_change_ci": [low, high]}


def table(results: dict[str, Any]) -> str:
    """Per seed, warm start and after-RL rows (TicTacToe win vs random, non-loss vs minimax, Kuhn
    exploitability; `-` for a game that did not run); per algorithm, the mean change across seeds."""
    lines = [
        f"{'seed':>4} {'policy':<26} {'TTT win vs random':<20} {'TTT non-loss vs minimax':<24} "
        f"{'Kuhn exploitability':>19} {'RL wall s':>9}"
    ]

    def row(seed: str, label: str, ttt: dict[str, Any] | None, kuhn_value: float | None, seconds: str) -> str:
        win = rate_text(ttt["opponents"]["random"]["all_seats"]) if ttt else "-"
        non_loss = rate_text(ttt["opponents"]["tictactoe-minimax"]["all_seats"], "non-loss") if ttt else "-"
        kuhn_text = f"{kuhn_value:.4f}" if kuhn_value is not None else "-"
        return f"{seed:>4} {label:<26} {win:<20} {non_loss:<24} {kuhn_text:>19} {seconds:>9}"

    for seed, run in results["seeds"].items():
        warm = run["warm_start"]
        ttt_warm = warm["tictactoe"]["eval"] if "tictactoe" in warm else None
        lines.append(row(seed, "warm start (SFT)", ttt_warm, warm.get("kuhn", {}).get("exploitability"), ""))
        for name, result in run["algorithms"].items():
            ttt = result["tictactoe"]["final"] if "tictactoe" in result else None
            kuhn_value = result["kuhn"]["curve"][-1]["exploitability"] if "kuhn" in result else None
            seconds = sum(part["seconds"] for part in result.values())
            lines.append(row(seed, f"after RL: {name}", ttt, kuhn_value, f"{seconds:.0f}"))
            if "selected" in result.get("tictactoe", {}):
                chosen = result["tictactoe"]["selected"]
                lines.append(row(seed, f"  selected: step {chosen['step']}", chosen["eval"], None, ""))
    for name, across in results.get("summary", {}).items():
        if "mean_change" not in across:
            continue
        low, high = across["mean_change_ci"]
        separated = sum(p["separated"] for p in across["per_seed"].values())
        lines.append(
            f"{name}: TicTacToe win-rate change {across['mean_change']:+.3f} [{low:+.3f}, {high:+.3f}] (95% t, "
            f"{len(across['per_seed'])} seeds); separated from the warm start in {separated} of "
            f"{len(across['per_seed'])}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[Settings, list[str]]:
    """Settings from the flags, and the algorithms to run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rl_algorithms = [name for name in ALGORITHMS if name != "sft"]
    parser.add_argument("--algorithm", default="reinforce", choices=rl_algorithms)
    parser.add_argument("--all-algorithms", action="store_true", help="run every RL algorithm in ALGORITHMS")
    for f in fields(Settings):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(f.default, bool):  # --self-play / --no-self-play
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    args = parser.parse_args(argv)
    settings = Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})
    return settings, rl_algorithms if args.all_algorithms else [args.algorithm]


def run_seed(s: Settings, algorithms: list[str], model: str, infosets, save) -> dict[str, Any]:
    """Warm start, then RL with each algorithm, for `s.seed`; `save()` is called after each algorithm."""
    print(f"seed {s.seed}: warm start, SFT on scripted moves", flush=True)
    sft = {"tictactoe": (s.sft_games, s.sft_agent), "kuhn": (s.kuhn_sft_games, s.kuhn_sft_agent)}
    warm = {game: warm_start(SPECS[game], *sft[game], model, s) for game in s.game_names}
    for game, result in warm.items():
        spec = SPECS[game]
        result["eval"] = evaluate_at(spec, model, result["checkpoint"], OPPONENTS[spec], s.eval_games, s)
    if "kuhn" in warm:
        warm["kuhn"]["exploitability"] = warm["kuhn"]["eval"]["kuhn"]["exploitability"]
    run = {"warm_start": warm, "algorithms": {}}
    for algorithm in algorithms:
        print(f"seed {s.seed}: RL with {algorithm}", flush=True)
        result = {}
        if "tictactoe" in warm:
            result["tictactoe"] = tictactoe(algorithm, warm["tictactoe"], model, s)
        if "kuhn" in warm:
            result["kuhn"] = kuhn(algorithm, warm["kuhn"], model, infosets, s)
        run["algorithms"][algorithm] = result
        save(run)
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark for every seed, write the JSON and PNGs, print the table; returns the results."""
    s, algorithms = parse_args(argv)
    start = time.time()
    out = Path(s.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ensure_tiny_model(s.model_dir)
    model = s.model_dir  # as given (relative by default), so no machine path lands in the results
    infosets = list(kuhn_information_sets(KUHN.env_id))
    results = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "settings": asdict(s),
        "seeds": {},
    }

    def save(run: dict[str, Any], seed: int) -> None:  # after each algorithm of each seed: a crash keeps it
        results["seeds"][str(seed)] = run
        results["summary"] = {name: summary(results, name) for name in run["algorithms"]}
        for name in run["algorithms"]:
            per_seed = {k: v["algorithms"][name] for k, v in results["seeds"].items() if name in v["algorithms"]}
            plot(name, per_seed, out / f"learning-{name}.png")
        results["wall_seconds"] = time.time() - start
        (out / "learning.json").write_text(json.dumps(results, indent=2))

    for seed in range(s.seed, s.seed + s.seeds):
        one = replace(s, seed=seed, runs_dir=f"{s.runs_dir}/seed-{seed}")
        run_seed(one, algorithms, model, infosets, lambda run, seed=seed: save(run, seed))
    print(table(results))
    print(f"wall time: {results['wall_seconds']:.0f}s; results in {out}")
    return results


if __name__ == "__main__":
    main()
