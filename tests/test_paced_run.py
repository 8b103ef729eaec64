"""One paced run through `unstable train`, bf16 with full fine-tuning, and what a user reads of it: the balance per
step and the advice at the end; the progress line's training win rate per opponent over the tracker's rolling window
(not a frozen evaluation); pacing training on what the games generate instead of letting the StepBuffer drop most of
it (72% of a demo's generated steps were dropped before pacing); and float32 master weights, so a 1e-5 step changes
the bf16 weights."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from unstable.cli.main import main
from unstable.runtime import resume
from unstable.tracking import keys
from unstable.tracking.balance import balance_lines

from .runs import EXAMPLE, tiny_run


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
def test_a_paced_bf16_run_logs_its_balance_its_win_rate_per_opponent_drops_few_steps_and_updates_float32_masters(
    tiny_model_dir, tmp_path, capsys
):
    # the demo's proportions cut down: 16 games in flight, a buffer of 2 batches, the learner slower than the games
    overrides = tiny_run(
        tmp_path,
        tiny_model_dir,
        "paced",
        "learner.num_steps=4",
        "learner.batch_size=16",
        "buffer.max_buffer_size=32",
        "collector.num_workers=16",
        "collector.pacing=true",
        "pool.sample_mode=fixed",  # every training game against the random agent
        "warm_start=null",  # the random tiny model: what it learns does not matter here
        "model.dtype=bfloat16",
        "learner.policy.lora=null",
        "learner.optimizer.learning_rate=1e-5",
    )
    assert main(["train", str(EXAMPLE), "--no-wandb", *(a for o in overrides for a in ("--set", o))]) == 0
    run_dir = tmp_path / "paced"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row.get(keys.STEP, 0) > 0]
    assert [row[keys.STEP] for row in steps] == [1, 2, 3, 4]
    for row in steps:
        assert 0 <= row[keys.WAIT_SECONDS] <= row[keys.STEP_SECONDS]
        assert row[keys.WAIT_SHARE] == pytest.approx(row[keys.WAIT_SECONDS] / row[keys.STEP_SECONDS])
        assert 0 <= row[keys.HELD_BACK_SHARE] <= 1 and row[keys.HELD_BACK_SLOT_SECONDS] >= 0
    printed = capsys.readouterr().out
    lines = balance_lines(rows)
    assert lines[0].startswith("balance over learner steps 2-4")
    for line in lines:
        assert f"  {line}\n" in printed

    progress = [line for line in printed.splitlines() if line.startswith("step ")]
    assert re.search(r"\| win vs random \d\.\d\d \(n=\d+\)$", progress[-1]), progress[-1]
    assert "eval" not in progress[-1]

    final = rows[-1]
    assert final[keys.BUFFER_STEPS_ADDED] >= 4 * 16
    assert final[keys.BUFFER_STEPS_DROPPED] < 0.1 * final[keys.BUFFER_STEPS_ADDED]
    assert final[keys.GAMES_HELD_BACK] > 0

    weights = resume.load_part(run_dir / "state" / "step-4", "learner")["policy"]
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.float32}
    changed = [float((weights[name] != base[name]).float().mean()) for name in base]
    assert min(changed) > 0.9  # four 1e-5 AdamW steps moved (almost) every weight of every tensor ...
    assert max(float((weights[name] - base[name]).abs().max()) for name in base) < 1e-3  # ... by about 1e-5 each
    saved = load_file(run_dir / "checkpoints" / "ckpt-4" / "model.safetensors")
    assert {w.dtype for w in saved.values()} == {torch.bfloat16}
