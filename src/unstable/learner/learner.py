"""The StandardLearner: pulls batches, lets the algorithm update the model, saves and registers checkpoints.

It owns the plumbing once for every algorithm: loading the model (LoRA via PEFT, or full fine-tuning),
micro-batching by token budget, token log-probs, gradient clipping, atomic checkpoint saving and the
hand-off to the ModelPool, from where the next games pick the new adapter up.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from unstable.algorithms.base import BaseAlgo
from unstable.learner.batching import TokenBatch, collate, pack_micro_batches
from unstable.records import Step

log = logging.getLogger(__name__)

DEFAULT_LORA = {
    "lora_rank": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


class StandardLearner:
    """Single-process learner. `lora_cfg=None` with `full_finetune=True` trains every weight instead of LoRA."""

    def __init__(
        self,
        model_name: str,
        step_buffer,
        model_pool,
        tracker,
        algorithm: BaseAlgo,
        *,
        run_dir: str = "runs/default",
        batch_size: int = 32,
        mini_batch_size: int | None = None,
        micro_batch_tokens: int = 8192,
        learning_rate: float = 1e-5,
        grad_clip: float = 1.0,
        lora_cfg: dict[str, Any] | None = None,
        full_finetune: bool = False,
        initial_lora_path: str | None = None,
        max_train_len: int | None = None,
        temperature: float = 1.0,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
        gradient_checkpointing: bool = False,
        poll_interval_s: float = 0.05,
        max_staleness: int | None = None,
    ):
        self.model_name = model_name
        self.step_buffer = step_buffer
        self.model_pool = model_pool
        self.tracker = tracker
        self.algorithm = algorithm
        self.run_dir = Path(run_dir)
        self.batch_size = batch_size
        self.mini_batch_size = mini_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        self.learning_rate = learning_rate
        self.grad_clip = grad_clip
        self.lora_cfg = None if full_finetune else {**DEFAULT_LORA, **(lora_cfg or {})}
        self.initial_lora_path = initial_lora_path
        self.max_train_len = max_train_len
        self.max_staleness = max_staleness
        self.temperature = temperature
        self.device = device
        self.dtype = dtype
        self.num_threads = num_threads
        self.gradient_checkpointing = gradient_checkpointing
        self.poll_interval_s = poll_interval_s
        self.step = 0
        self._ratios = _RatioStats()
        self.model = None
        self.optimizer = None

    # ---- set-up -------------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Load the model and tokenizer, wrap LoRA, build the optimizer. Idempotent."""
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        model = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=getattr(torch, self.dtype))
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = self._wrap_lora(model).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.trainable_parameters(), lr=self.learning_rate)
        self.algorithm.initialize(self)

    def _wrap_lora(self, model):
        if self.lora_cfg is None:
            return model
        from peft import LoraConfig, PeftModel, get_peft_model

        if self.initial_lora_path:
            return PeftModel.from_pretrained(model, self.initial_lora_path, is_trainable=True)
        cfg = LoraConfig(
            r=self.lora_cfg["lora_rank"],
            lora_alpha=self.lora_cfg["lora_alpha"],
            lora_dropout=self.lora_cfg["lora_dropout"],
            target_modules=list(self.lora_cfg["target_modules"]),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, cfg)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters the optimizer updates (LoRA weights, or all weights when fully fine-tuning)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def add_parameters(self, params, lr: float | None = None) -> None:
        """Let an algorithm train extra parameters (a value head) with the same optimizer, at `lr` if given."""
        group = {"params": list(params)}
        self.optimizer.add_param_group(group if lr is None else group | {"lr": lr})

    # ---- helpers for algorithms ---------------------------------------------------------------------
    def micro_batches(self, steps: list[Step]) -> Iterator[TokenBatch]:
        """Token-budget micro-batches of `steps`, collated and moved to the device."""
        for group in pack_micro_batches(steps, self.micro_batch_tokens, self.mini_batch_size, self.max_train_len):
            yield collate(group, self.pad_id, self.max_train_len).to(self.device)

    def forward(self, batch: TokenBatch, output_hidden_states: bool = False):
        """The model's forward pass on a batch."""
        return self.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=output_hidden_states
        )

    def token_logprobs(self, batch: TokenBatch, outputs=None) -> torch.Tensor:
        """log softmax(logits / temperature) of each next token, `(B, L-1)`; pass `outputs` to reuse a forward."""
        outputs = outputs if outputs is not None else self.forward(batch)
        logits = outputs.logits[:, :-1].float() / self.temperature  # (B, L-1, V)
        targets = batch.input_ids[:, 1:]  # (B, L-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, L-1)

    @torch.no_grad()
    def track_ratios(self, logp: torch.Tensor, batch: TokenBatch) -> None:
        """Record the importance ratios `exp(current - behaviour)` of `batch`'s completion tokens.

        They become this update's `learner/ratio_mean` and `learner/ratio_max`: how far the learner's policy
        has moved from the samplers'. Every RL algorithm calls this on its first pass over the batch (for PPO
        its first epoch, whose later minibatches also see that epoch's earlier steps).
        """
        ratios = torch.exp(logp - batch.behaviour_logprobs)[batch.completion_mask.bool()]  # (n_tokens,)
        self._ratios.add(ratios)

    def staleness(self, step: Step) -> int:
        """Learner updates since the policy that sampled `step` (the base model, version -1, counts as 0)."""
        return self.step - max(step.policy_version, 0)

    def drop_stale(self, steps: list[Step]) -> tuple[list[Step], int]:
        """`steps` without those more than `max_staleness` updates old, and how many were dropped."""
        if self.max_staleness is None:
            return steps, 0
        fresh = [s for s in steps if self.staleness(s) <= self.max_staleness]
        return fresh, len(steps) - len(fresh)

    def optimizer_step(self) -> float:
        """Clip, step and zero the gradients; returns the pre-clip gradient norm."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    # ---- the loop -----------------------------------------------------------------------------------
    def train_step(self, steps: list[Step]) -> dict[str, float]:
        """One algorithm update on `steps`; returns its metrics plus batch statistics."""
        self.initialize()
        start = time.perf_counter()
        staleness = [self.staleness(s) for s in steps]
        self._ratios = _RatioStats()
        metrics = self.algorithm.update(steps, self) | self._ratios.metrics()
        self.step += 1
        rewards = [s.reward for s in steps]
        metrics.update(
            {
                "learner/step": self.step,
                "learner/batch_size": len(steps),
                "learner/mean_reward": sum(rewards) / len(rewards),
                "learner/mean_completion_tokens": sum(len(s.completion_token_ids) for s in steps) / len(steps),
                "learner/staleness_mean": sum(staleness) / len(staleness),
                "learner/staleness_max": max(staleness),
                "learner/update_seconds": time.perf_counter() - start,
            }
        )
        return metrics

    def save_checkpoint(self) -> str:
        """Write the adapter (or full model) for the current step atomically; returns its directory."""
        final = self.run_dir / "checkpoints" / f"ckpt-{self.step}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        if self.lora_cfg is None:
            self.tokenizer.save_pretrained(tmp)
        if final.exists():  # a re-run into the same directory replaces the old checkpoint
            shutil.rmtree(final)
        os.replace(tmp, final)
        return str(final)

    def train(self, num_steps: int) -> list[dict[str, Any]]:
        """Run `num_steps` updates: wait for a batch, update, save, register with the pool, log a row.

        With `max_staleness` set, steps sampled more than that many updates ago are dropped from each batch
        (counted as `learner/stale_dropped`); a batch left empty is replaced by the next one.
        """
        self.initialize()
        rows = []
        for _ in range(num_steps):
            steps, waited, dropped = self._wait_for_batch()
            metrics = self.train_step(steps)
            path = self.save_checkpoint()
            self.model_pool.add_checkpoint(path=path, iteration=self.step, kind="lora" if self.lora_cfg else "full")
            metrics["learner/wait_seconds"] = waited
            metrics["learner/stale_dropped"] = dropped
            rows.append(self.tracker.log(metrics))
        return rows

    def _wait_for_batch(self) -> tuple[list[Step], float, int]:
        """Block until the buffer yields a batch with fresh steps; returns them, the seconds waited and the
        number of stale steps dropped on the way."""
        start = time.perf_counter()
        dropped = 0
        while True:
            while self.step_buffer.size() < self.batch_size:
                time.sleep(self.poll_interval_s)
            steps, stale = self.drop_stale(self.step_buffer.get_batch(self.batch_size))
            dropped += stale
            if steps:
                return steps, time.perf_counter() - start, dropped


@dataclass
class _RatioStats:
    """Running mean and max of importance ratios over one update."""

    total: float = 0.0
    count: int = 0
    max: float = 0.0

    def add(self, ratios: torch.Tensor) -> None:
        if ratios.numel():
            self.total += float(ratios.sum())
            self.count += ratios.numel()
            self.max = max(self.max, float(ratios.max()))

    def metrics(self) -> dict[str, float]:
        """`learner/ratio_mean` and `learner/ratio_max`, or nothing if no ratio was recorded."""
        if not self.count:
            return {}
        return {"learner/ratio_mean": self.total / self.count, "learner/ratio_max": self.max}
