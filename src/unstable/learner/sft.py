"""Warm start by supervised fine-tuning on moves of scripted agents, with the same learner code as RL.

The supervised `Step`s come from `unstable.collector.demonstrations`: the observation rendered with the
env's prompt template as the prompt, `template.format_action(move)` plus the eos token as the completion.
`run_sft` trains on them with a `Learner` and the `SFT` algorithm and saves a checkpoint (a LoRA adapter, or a
full model with `lora: None`) that RL can start from through `learner.policy.initial_lora_path`. `warm_start` does both
for a `WarmStartConfig`: the one way `unstable train`'s warm start and `unstable sft` make one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

from unstable.algorithms.sft import SFT
from unstable.collector.demonstrations import generate_sft_steps
from unstable.learner.config import LearnerConfig, OptimizerConfig, PolicyConfig, WarmStartConfig
from unstable.learner.learner import Learner
from unstable.records import EnvSpec, Step
from unstable.tracking import keys


def sft_learner(model_path: str, cfg: LearnerConfig) -> Learner:
    """A `Learner` with the `SFT` algorithm on `model_path`, shaped by `cfg` (LoRA or full, rate, batching)."""
    return Learner.build(model_path, SFT(), cfg)


def run_sft(
    model_path: str,
    steps: list[Step],
    cfg: LearnerConfig,
    *,
    out_dir: str,
    epochs: int = 3,
    seed: int = 0,
    on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
    on_update: Callable[[dict[str, float]], None] = lambda metrics: None,
) -> str:
    """Fine-tune `model_path` on `steps` for `epochs` shuffled passes and return the saved checkpoint's path.

    Each batch of `cfg.batch_size` steps is one `Learner.train_step` with the `SFT` algorithm. The checkpoint
    is `out_dir/checkpoints/ckpt-<updates>`. `on_epoch` gets `{"epoch", "loss", "updates"}` after each pass
    (the loss is the mean over that pass's batches), `on_update` each update's metrics (a progress bar counts
    them: `epochs * ceil(len(steps) / cfg.batch_size)` in all). `seed` seeds torch (fresh LoRA weights) and the
    shuffling.
    """
    if not steps:
        raise ValueError("no supervised steps to train on")
    torch.manual_seed(seed)  # the fresh LoRA weights
    learner = sft_learner(model_path, cfg)
    rng = random.Random(seed)
    order = list(steps)
    size = cfg.batch_size
    for epoch in range(1, epochs + 1):
        rng.shuffle(order)
        losses = []
        for start in range(0, len(order), size):
            metrics = learner.train_step(order[start : start + size])
            on_update(metrics)
            losses.append(metrics[keys.LOSS])
        on_epoch({"epoch": epoch, "loss": sum(losses) / len(losses), "updates": learner.step})
    return learner.save_checkpoint(str(Path(out_dir) / "checkpoints" / f"ckpt-{learner.step}"))


def warm_start(
    model_path: str,
    spec: EnvSpec,
    ws: WarmStartConfig,
    *,
    policy: PolicyConfig,
    out_dir: str,
    seed: int = 0,
    num_threads: int | None = None,
    on_moves: Callable[[int], None] = lambda moves: None,
    on_epoch: Callable[[dict[str, float]], None] = lambda row: None,
    on_update: Callable[[dict[str, float]], None] = lambda metrics: None,
) -> str:
    """SFT of `model_path` on the valid moves of `ws.agents` (one per seat) in `ws.games` games of `spec`, as
    `policy` shapes the model (its LoRA adapter, or every weight); returns the checkpoint path under `out_dir`
    (`run_sft`).

    `on_moves` gets the number of supervised moves before training starts; each `on_epoch` row also carries it as
    `moves`. `seed` seeds the games, the fresh weights and the shuffling."""
    from transformers import AutoTokenizer

    steps = generate_sft_steps(spec, ws.agents, ws.games, AutoTokenizer.from_pretrained(model_path), seed=seed)
    on_moves(len(steps))
    optimizer = OptimizerConfig(learning_rate=ws.learning_rate)
    cfg = LearnerConfig(batch_size=ws.batch_size, policy=policy, optimizer=optimizer, num_threads=num_threads)
    return run_sft(
        model_path,
        steps,
        cfg,
        out_dir=out_dir,
        epochs=ws.epochs,
        seed=seed,
        on_epoch=lambda row: on_epoch(row | {"moves": len(steps)}),
        on_update=on_update,
    )
