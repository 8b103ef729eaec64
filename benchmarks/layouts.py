"""The learner's forward and backward passes under each `learner.policy.layout`, on real prompts.

Two batches of the tiny model's games in the `qwen3-zs` template: Kuhn Poker's vine batch (each of 8 information
sets' observation with 8 moves: a group shares its whole prompt) and TicTacToe positions from random play (the
prompts share their opening rules). Each layout runs every micro-batch's forward and backward pass `--repeats`
times, twice over, alternating; the least time of each is reported. Writes JSON and prints a table:

    python benchmarks/layouts.py [--model .cache/tiny-qwen3] [--repeats 3] [--out benchmarks/results/layouts.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from recorded import settings  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from unstable.games.episode import start_env  # noqa: E402
from unstable.games.kuhn import kuhn_information_sets  # noqa: E402
from unstable.games.templates import get_template  # noqa: E402
from unstable.learner.config import PolicyConfig  # noqa: E402
from unstable.learner.policy_model import PolicyModel  # noqa: E402
from unstable.models.tiny import ensure_tiny_model  # noqa: E402
from unstable.records import EnvSpec, Step  # noqa: E402

LAYOUTS = ("padded", "shared-prompts")


def as_step(tokenizer, observation: str, completion: str) -> Step:
    """A move at `observation` whose completion is `completion`, tokenised as the learner trains on it."""
    prompt = tuple(tokenizer(get_template("qwen3-zs").render(observation))["input_ids"])
    tokens = tuple(tokenizer(completion, add_special_tokens=False)["input_ids"])
    return Step("E", 0, 0, observation, completion, prompt_token_ids=prompt, completion_token_ids=tokens,
                behaviour_logprobs=(-1.0,) * len(tokens), reward=1.0)  # fmt: skip


def kuhn_vines(tokenizer, decisions: int, rng: random.Random) -> list[Step]:
    """`decisions` information sets' observations, 8 moves each (a vine group)."""
    observations = [info.observation for info in kuhn_information_sets("KuhnPoker-v0-single-train")]
    moves = ("\\boxed{[bet]}", "\\boxed{[check]}")
    return [as_step(tokenizer, observations[d % 12], rng.choice(moves)) for d in range(decisions) for _ in range(8)]


def tictactoe_positions(tokenizer, rows: int, rng: random.Random) -> list[Step]:
    """`rows` positions after 0-5 random moves, one move each."""
    steps = []
    for seed in range(rows):
        env = start_env(EnvSpec("TicTacToe-v0-train", 2), seed)
        for _ in range(rng.randrange(6)):
            done, _ = env.step(f"[{rng.randrange(9)}]")
            if done:
                break
        _, observation = env.get_observation()
        steps.append(as_step(tokenizer, observation, f"\\boxed{{[{rng.randrange(9)}]}}"))
    return steps


def pass_seconds(model: str, layout: str, steps: list[Step], repeats: int) -> float:
    """The least time of `repeats` forward and backward passes over `steps`' micro-batches."""
    policy = PolicyModel(model, PolicyConfig(lora=None, layout=layout))
    policy.load()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in policy.micro_batches(steps):
            policy.forward(batch).logprobs.sum().backward()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/tiny-qwen3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kuhn-decisions", type=int, default=8, help="Kuhn Poker decisions of 8 moves each")
    parser.add_argument("--tictactoe-rows", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/layouts.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = str(ensure_tiny_model(args.model))
    rng = random.Random(0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    batches = {"kuhn_vines": kuhn_vines(tokenizer, args.kuhn_decisions, rng)}
    batches["tictactoe"] = tictactoe_positions(tokenizer, args.tictactoe_rows, rng)
    rows = {}
    for name, steps in batches.items():
        seconds = {layout: [] for layout in LAYOUTS}
        for layout in LAYOUTS * 2:
            seconds[layout].append(pass_seconds(model, layout, steps, args.repeats))
        prompt = sum(len(s.prompt_token_ids) for s in steps) / len(steps)
        least = {f"{layout}_seconds": min(times) for layout, times in seconds.items()}
        rows[name] = {"rows": len(steps), "mean_prompt_tokens": prompt} | least
        print(f"{name}: {len(steps)} rows, {prompt:.0f} prompt tokens on average: "
              + ", ".join(f"{k} {min(v):.3f} s" for k, v in seconds.items()), flush=True)  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"settings": settings(args), "batches": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
