"""Warm start by supervised fine-tuning on moves of scripted agents, with the same learner code as RL.

Scripted agents play games; every move they make becomes one supervised `Step`: the observation rendered
with the env's prompt template as the prompt, `template.format_action(move)` plus the eos token as the
completion. `run_sft` trains on those steps with `StandardLearner` and the `SFT` algorithm and saves a
checkpoint (a LoRA adapter, or a full model with `full_finetune`) that RL can start from through
`learner.initial_lora_path`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from unstable.agents.scripted import make_scripted_agent
from unstable.algorithms.sft import SFT
from unstable.games.episode import DEFAULT_MAX_TURNS, play_episode
from unstable.games.templates import get_template
from unstable.learner.learner import StandardLearner
from unstable.records import EnvSpec, Step


def supervised_step(step: Step, spec: EnvSpec, tokenizer: Any) -> Step:
    """`step` (a move of any agent) with the tokens a model would need to have played it.

    The prompt is tokenised exactly as the inference backends do (no special tokens added); the completion
    is the template's rendering of `step.action` followed by the eos token id, so the model learns to stop.
    Behaviour log-probs are zeros: no sampling policy produced these tokens.
    """
    template = get_template(spec.prompt_template)
    prompt = template.render(step.observation, tokenizer)
    completion = template.format_action(step.action)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = [*tokenizer(completion, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    return replace(
        step,
        raw_output=completion,
        prompt=prompt,
        prompt_token_ids=tuple(prompt_ids),
        completion_token_ids=tuple(completion_ids),
        behaviour_logprobs=(0.0,) * len(completion_ids),
        format_ok=True,
    )


def generate_sft_steps(
    spec: EnvSpec,
    agents: Sequence[str],
    num_games: int,
    tokenizer: Any,
    *,
    seed: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> list[Step]:
    """Play `num_games` games between the scripted `agents` (one name per seat, rotated one seat per game)
    and return every valid move as a supervised step. Moves the env rejected are left out."""
    if len(agents) != spec.num_players:
        raise ValueError(f"{spec.env_id} needs {spec.num_players} agents, got {list(agents)}")
    steps = []
    for game in range(num_games):
        game_seed = seed + game
        names = {pid: agents[(pid + game) % len(agents)] for pid in range(spec.num_players)}
        seated = {
            pid: make_scripted_agent(name, seed=game_seed * spec.num_players + pid) for pid, name in names.items()
        }
        record = play_episode(spec, seated, game_seed, max_turns=max_turns)
        steps += [supervised_step(s, spec, tokenizer) for s in record.steps if s.format_ok and not s.invalid_move]
    return steps


def sft_learner(model_path: str, **learner_kwargs: Any) -> StandardLearner:
    """A `StandardLearner` with the `SFT` algorithm and no buffer, pool or tracker: it trains on the steps
    passed to `train_step`, scores completions with `token_logprobs`, and saves checkpoints under its
    `run_dir`. `learner_kwargs` go to the learner (run_dir, learning rate, LoRA or full fine-tuning, an
    initial adapter, threads, temperature, ...)."""
    return StandardLearner(
        model_path, step_buffer=None, model_pool=None, tracker=None, algorithm=SFT(), **learner_kwargs
    )


def run_sft(
    model_path: str,
    steps: list[Step],
    *,
    out_dir: str,
    epochs: int = 3,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    lora_cfg: dict[str, Any] | None = None,
    full_finetune: bool = False,
    micro_batch_tokens: int = 8192,
    num_threads: int | None = None,
    seed: int = 0,
    on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
) -> str:
    """Fine-tune `model_path` on `steps` for `epochs` shuffled passes and return the saved checkpoint's path.

    Each batch of `batch_size` steps is one `StandardLearner.train_step` with the `SFT` algorithm. The
    checkpoint is `out_dir/checkpoints/ckpt-<updates>`. `on_epoch` gets `{"epoch", "loss", "updates"}` after
    each pass (the loss is the mean over that pass's batches). `seed` seeds torch (the fresh LoRA weights) and
    the shuffling.
    """
    if not steps:
        raise ValueError("no supervised steps to train on")
    torch.manual_seed(seed)  # the fresh LoRA weights
    learner = sft_learner(
        model_path,
        run_dir=out_dir,
        learning_rate=learning_rate,
        lora_cfg=lora_cfg,
        full_finetune=full_finetune,
        micro_batch_tokens=micro_batch_tokens,
        num_threads=num_threads,
    )
    rng = random.Random(seed)
    order = list(steps)
    for epoch in range(1, epochs + 1):
        rng.shuffle(order)
        losses = [
            learner.train_step(order[i : i + batch_size])["learner/loss"] for i in range(0, len(order), batch_size)
        ]
        on_epoch({"epoch": epoch, "loss": sum(losses) / len(losses), "updates": learner.step})
    return learner.save_checkpoint()
