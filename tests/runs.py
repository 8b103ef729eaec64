"""Small runs through `unstable train`'s YAML path: the demo config cut down to a few learner steps of the tiny model.

The tests of the paths users take (engine x fine-tuning x dtype x inference actors x games with chance) each run
`tiny_run(...)` plus the overrides that make their path:

| path | test |
|---|---|
| transformers, full fine-tuning after a warm start, A2C, top_p 0.5, `buffer.discount` | `test_runtime_ray` |
| transformers, two inference actors | `test_runtime_ray`: different samples for one prompt |
| transformers, LoRA, two inference actors, one killed after step 1 | `test_faults`: both serve the newest adapter |
| transformers, bf16, full fine-tuning, 16 games in flight, pacing | `test_paced_run`: balance, progress, masters |
| transformers, LoRA warm start, KL penalty, moved and resumed | `test_run_dir_moves`: zero KL at the start |
| Kuhn Poker, branched groups, 8 game threads | `test_branching`: every branch of a group sees the same deals |
| vLLM, LoRA of rank 96, top_p 0.5 | `test_vllm_backend`: two learner steps |
| vLLM, two inference actors, the original API | `test_seed_scripts`: seed 002's script |
| vLLM, full fine-tuning | `test_vllm_backend`: no failed game, the new weights serve |
| LoRA warm start, killed in it and twice in RL, resumed each time | `test_resume_kill` |
| transformers, full fine-tuning, every weight load failing | `test_faults`: the run stops with the cause, status 1 |
| two learner actors (gloo), killed after a row and resumed | `test_learners`: each step logged once |
| two FSDP-sharded full fine-tuning learners, killed after a row and resumed | `test_learners`: whole checkpoints |
| transformers, LoRA, the inference actor on a second Ray node, resumed | `test_ray_cluster`: checkpoints shipped |
"""

import json
from pathlib import Path

EXAMPLE = Path(__file__).parent.parent / "examples" / "tictactoe-tiny.yaml"


def tiny_run(tmp_path: Path, model_dir: str, name: str, *overrides: str) -> list[str]:
    """`--set` overrides of the demo config for a run `tmp_path/name` on the tiny model at `model_dir`: 1 learner
    step of 4 samples from 2 games in flight, 4 new tokens, no evaluation, no TensorBoard or W&B. The recipe the
    tests' checks were written against stays pinned, whatever the demo's: one learner rank, no warm-up of the learning
    rate (the one update changes the weights), and half the games mirror self-play, half against `random` (the
    learner's checkpoint in both seats), rewards z-scored per env, a KL penalty of 0.1. `overrides` come last, so
    they win."""
    return [
        f"run.dir={tmp_path}",
        f"run.name={name}",
        f"model.path={model_dir}",
        "model.build_tiny_if_missing=false",
        "learner.num_steps=1",
        "learner.batch_size=4",
        "learner.num_learners=1",
        "learner.optimizer.learning_rate=6.0e-4",
        "learner.optimizer.warmup_steps=0",
        "learner.algorithm.args={ref_kl_coef: 0.1}",
        "pool.sample_mode=random",
        "pool.fixed_opponents=[random]",
        "buffer.max_buffer_size=128",
        "buffer.sampling_reward_transforms=[{name: NormalizeRewardsByEnv, args: {z_score: true}}]",
        "collector.num_workers=2",
        "collector.num_eval_workers=0",
        "inference.max_new_tokens=4",
        "evaluation.games_at_start=0",
        "evaluation.games_at_end=0",
        "tracker.wandb=disabled",
        "tracker.tensorboard=false",
        *overrides,
    ]


# two inference actors serving LoRA adapters, hot-swapped after each update
TWO_ACTORS_LORA = (
    "inference.num_actors=2",
    "warm_start=null",
    "learner.policy.lora={lora_rank: 4, lora_alpha: 8}",
    "collector.num_workers=4",
    "evaluation.games_at_end=4",  # the final evaluation's games play the newest adapter
)


def run_rows(run_dir: Path) -> list[dict]:
    """Every row of a run's metrics.jsonl, the final one included."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def ray_workers_since(started: float) -> list:
    """The live Ray worker processes (titled `ray::...`: actors and idle workers) started at or after `started` (a
    process creation time) on a Ray whose processes descend from the test process, as the shared head's do
    (`shared_ray`): a run's actors, earlier runs' left out. Another worker's tests, on its own Ray, are not seen."""
    import psutil

    workers = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.create_time() >= started and process.cmdline()[0].startswith("ray::"):
                workers.append(process)
        except (psutil.NoSuchProcess, IndexError):
            continue
    return workers
