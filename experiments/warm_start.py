"""Warm-start probe: how fast does SFT on random TicTacToe moves teach the tiny model which cells are legal?

The random agent only plays empty cells, so a model that reads the board puts all its probability on legal
cells; one that only learned the answer format spreads it like the marginal distribution of moves (~0.6 on
legal cells). For each variant (weight init scale, full fine-tuning or LoRA) this builds the tiny model,
trains on the same moves with the `SFT` algorithm and a `Learner`, and every `--eval-every` updates
measures the probability mass the model puts on legal cells at the answer's digit, on held-out positions.

Writes `warm_start.json` under `--out-dir` and prints a table. Run on demand (never from tests):

    HF_HUB_OFFLINE=1 .venv/bin/python experiments/warm_start.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from unstable.collector.demonstrations import generate_sft_steps  # noqa: E402
from unstable.games.moves import legal_moves  # noqa: E402
from unstable.learner import LearnerConfig, LoraConfig, PolicyModel  # noqa: E402
from unstable.learner.sft import sft_learner  # noqa: E402
from unstable.models.tiny import build_tiny_model, build_tokenizer  # noqa: E402
from unstable.records import EnvSpec, Step  # noqa: E402

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
LORA_ALL = {"lora_rank": 16, "lora_alpha": 32, "target_modules": [*LoraConfig().target_modules, "lm_head"]}
VARIANTS = {  # name: (initializer_range, LoRA config or None for full fine-tuning, learning rate)
    "init 0.02, full fine-tune": (0.02, None, 1e-3),
    "init 0.1, full fine-tune": (0.1, None, 1e-3),
    "init 0.1, LoRA r16 + lm_head": (0.1, LORA_ALL, 3e-3),
}


def legal_mass(policy: PolicyModel, steps: list[Step], tokenizer) -> float:
    """Mean probability, over `steps`, that the model's answer digit names one of the position's legal cells.

    The model reads the prompt plus the completion up to the digit (`\\boxed{[`); the next-token distribution
    is summed over the digit tokens of the legal cells."""
    digits = {str(d): tokenizer.convert_tokens_to_ids(str(d)) for d in range(9)}
    masses = []
    policy.model.eval()
    with torch.no_grad():
        for step in steps:
            prefix = list(step.prompt_token_ids) + list(step.completion_token_ids[:3])  # '\', 'boxed', '{['
            probs = policy.model(input_ids=torch.tensor([prefix])).logits[0, -1].softmax(-1)
            legal = [move.strip("[]") for move in legal_moves(step.observation)]
            masses.append(sum(probs[digits[d]].item() for d in legal))
    policy.model.train()
    return sum(masses) / len(masses)


def probe(name: str, model_dir: str, steps: list[Step], held_out: list[Step], args) -> dict[str, Any]:
    """Train one variant for `args.updates` batches; returns its curve of (updates, loss, legal mass, seconds)."""
    init, lora_cfg, lr = VARIANTS[name]
    build_tiny_model(model_dir, initializer_range=init, seed=args.seed)
    torch.manual_seed(args.seed)
    learner = sft_learner(
        model_dir, LearnerConfig(policy={"lora": lora_cfg}, optimizer={"learning_rate": lr}, num_threads=args.threads)
    )
    learner.initialize()
    rng, order, start, losses, curve = random.Random(args.seed), [], time.time(), [], []
    for update in range(1, args.updates + 1):
        if len(order) < args.batch_size:
            order = rng.sample(steps, len(steps))
        batch, order = order[: args.batch_size], order[args.batch_size :]
        losses.append(learner.train_step(batch)["learner/loss"])
        if update % args.eval_every == 0:
            mass = legal_mass(learner.policy, held_out, learner.policy.tokenizer)
            loss = sum(losses[-args.eval_every :]) / args.eval_every
            curve.append({"updates": update, "loss": loss, "legal_mass": mass, "seconds": time.time() - start})
            print(f"  {name}: {update} updates, loss {loss:.3f}, legal mass {mass:.3f}", flush=True)
    return {"initializer_range": init, "lora": lora_cfg, "learning_rate": lr, "curve": curve}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every variant on the same moves, write the JSON and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=600, help="random-vs-random games to learn from")
    parser.add_argument("--held-out", type=int, default=200, help="positions kept out of training for the probe")
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out-dir", default="experiments/results")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "settings": {k: v for k, v in vars(args).items() if k != "out_dir"},
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        # the tokenizer every variant's model is built with (it depends on the seed only)
        moves = generate_sft_steps(TICTACTOE, ["random", "random"], args.games, build_tokenizer(seed=args.seed))
        random.Random(args.seed).shuffle(moves)
        held_out, train = moves[: args.held_out], moves[args.held_out :]
        for i, name in enumerate(args.variants):
            results["variants"][name] = probe(name, str(Path(tmp) / f"v{i}" / "model"), train, held_out, args)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "warm_start.json").write_text(json.dumps(results, indent=2))
    print(f"{'variant':<30} {'updates':>7} {'loss':>6} {'legal mass':>10} {'seconds':>8}")
    for name, result in results["variants"].items():
        last = result["curve"][-1]
        print(
            f"{name:<30} {last['updates']:>7} {last['loss']:>6.3f} {last['legal_mass']:>10.3f} {last['seconds']:>8.0f}"
        )
    return results


if __name__ == "__main__":
    main()
