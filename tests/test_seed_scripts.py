"""The seed's own scripts run as written: `examples/seed_minimal.py` (seed 000, section 3) and
`examples/seed_training.py` (seed 002), each in a fresh Python process on Ray, with only the model name (the
tiny model), sizes, W&B (offline) and the API opponent's base URL (a chat-completions server on 127.0.0.1)
changed, and seed 002's script waiting for its last games before it prints the pool's ladder. Each substitution
below must match the script exactly, so this list is the whole difference."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unstable import atomic
from unstable.games.moves import legal_moves
from unstable.tracking import keys

from .chat_server import completion, serve

pytestmark = pytest.mark.slow  # the seed scripts on Ray

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT.parent / "shared" / "seeds"
SEED_MODEL = '"Qwen/Qwen3-1.7B-base"'
# a CPU machine: Ray is told of the seeds' three GPUs (logical ones) so the `num_gpus=1` learner and the inference
# actors can be placed; every model runs on the CPU because torch sees no CUDA device. No dashboard (~3 CPU-s of
# start-up a script: nothing here looks at it)
RAY_INIT = (
    'ray.init(namespace="unstable")',
    'ray.init(namespace="unstable", num_cpus=8, num_gpus=3, include_dashboard=False)',
)


def _run(script: str, substitutions: list[tuple[str, str]], cwd: Path, env: dict[str, str]) -> str:
    """Apply every substitution (each must occur), run the script with `env`, fail with its output if it fails;
    returns its standard output."""
    for old, new in substitutions:
        assert old in script, f"{old!r} is not in the script"
        script = script.replace(old, new)
    path = cwd / "script.py"
    path.write_text(script)
    result = subprocess.run(
        [sys.executable, str(path)], cwd=cwd, env=os.environ | env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _offline_env(tmp_path: Path) -> dict[str, str]:
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "RAY_DEDUP_LOGS": "0"}


def test_the_example_copies_are_the_seeds_scripts():
    """The examples hold the seeds' code verbatim (checked where the seeds are beside the repository)."""
    minimal = (ROOT / "examples" / "seed_minimal.py").read_text()
    training = (ROOT / "examples" / "seed_training.py").read_text()
    if SEEDS.is_dir():
        seed_000 = next(SEEDS.glob("000_*.txt")).read_text()
        code = re.search(r"### Minimal training script\n\n```python\n(.*?)```", seed_000, re.S).group(1)
        assert minimal.endswith(code)
        seed_002 = next(SEEDS.glob("002_*.txt")).read_text()
        code = seed_002.split("Training script\n", 1)[1].split("In a Nutshell", 1)[0]
        assert training.endswith(code.rstrip() + "\n")
    assert "unstable.StandardLearner.options(num_gpus=1" in minimal and "evaluation_opponent=" in training


@pytest.mark.long  # a minute or more of runs: scheduled first
def test_seed_000_minimal_training_script(tiny_model_dir, tmp_path):
    script = (ROOT / "examples" / "seed_minimal.py").read_text()
    _run(
        script,
        [
            (SEED_MODEL, repr(tiny_model_dir)),
            RAY_INIT,
            ("num_actors=2", "num_actors=1"),  # one vLLM engine (seed 002's script runs two)
            ("max_buffer_size=768", "max_buffer_size=64"),
            ('"max_tokens": 2048', '"max_tokens": 8'),
            ('"lora_config": {"lora_rank": 32}', '"lora_config": {"lora_rank": 96}'),  # above vLLM's former 64
            ('"max_model_len": 8192', '"max_model_len": 1024'),
            ("batch_size=384", "batch_size=8"),
            ('lora_cfg={"lora_rank": 32}', 'lora_cfg={"lora_rank": 96}'),
            ("num_workers=256", "num_workers=8"),
            ("learner.train.remote(100)", "learner.train.remote(2)"),
        ],
        tmp_path,
        _offline_env(tmp_path),
    )
    run_dir = tmp_path / "runs" / "demo"
    rows = _metrics(run_dir)
    assert [r["learner/step"] for r in rows] == [1, 2]
    assert (run_dir / "checkpoints" / "ckpt-2" / "adapter_model.safetensors").exists()
    assert rows[-1]["buffer/steps_added"] > 0 and rows[-1]["pool/checkpoints"] == 3
    assert sum(r["inference/generated_tokens"] for r in rows) > 0
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B wrote no offline run"


def _api_model_reply(number: int, headers: dict, body: dict):
    """An API model that plays the first legal move it can read (Kuhn Poker and SimpleTak list them)."""
    moves = legal_moves(body["messages"][-1]["content"])
    return 200, completion(f"\\boxed{{{moves[0] if moves else '[0]'}}}")


LADDER_MARK = "LADDER:"
# appended after training: wait for the games in flight, then print the pool's ladder as JSON
WAIT = f"""
ray.get(games)
import json
print({LADDER_MARK!r} + json.dumps(ray.get(model_pool.metrics.remote())[{keys.POOL_LADDER!r}]))"""


# the API opponent answers this many requests, then is down: two evaluation games at a time, each of one or two
# requests, so one of them ends while it is up
UP_FOR = 3
# inserted before training: the learner starts once the evaluation games have met the endpoint down (the number of
# requests the API model answered is in a file), so training cannot end first (a fresh clone's run made only 3)
WAIT_FOR_DOWN = """
import pathlib, time
deadline = time.time() + 300
while int(pathlib.Path({seen!r}).read_text()) <= {up_for}:
    assert time.time() < deadline, "no evaluation game met the API endpoint down"
    time.sleep(0.2)
"""


@pytest.mark.long  # a minute or more of runs: scheduled first
def test_seed_002_training_script_with_an_api_evaluation_opponent_that_goes_down(tiny_model_dir, tmp_path):
    """Training with evaluation games against the seed's API model, whose endpoint answers its first `UP_FOR`
    requests and then is down (HTTP 500 on every retry): the games played while it was up are rated, those after
    fail (which `tests/test_api_opponent.py` checks game by game), and training still finishes.

    Training starts once the evaluation games have met the endpoint down (`WAIT_FOR_DOWN`). The seed's script exits
    once training ends; here it then waits for the games still in flight (the collector starts no new ones after
    training) and prints the pool's ladder, so a rated evaluation game does not depend on finishing before the
    learner's last step."""

    seen = tmp_path / "requests-seen"  # replaced whole at each request, so the script never reads it half-written
    atomic.write_text(seen, "0")

    def up_then_down(number: int, headers: dict, body: dict):
        atomic.write_text(seen, str(number))
        return _api_model_reply(number, headers, body) if number <= UP_FOR else (500, {"error": {"message": "down"}})

    with serve(up_then_down) as chat:
        env = _offline_env(tmp_path) | {"UNSTABLE_API_BASE_URL": chat.url}
        stdout = _run(
            (ROOT / "examples" / "seed_training.py").read_text(),
            [
                (SEED_MODEL, repr(tiny_model_dir)),
                RAY_INIT,
                ("max_buffer_size=768", "max_buffer_size=64"),
                ('"lora_rank": 32, "lora_alpha": 32', '"lora_rank": 4, "lora_alpha": 32'),
                ('"max_tokens": 4096', '"max_tokens": 8'),
                ('"max_model_len": 8192', '"max_model_len": 1024'),
                ("batch_size=384", "batch_size=8"),
                ("max_generation_len=4096", "max_generation_len=8"),
                (
                    "collector.collect.remote(num_workers=384, num_eval_workers=16)",
                    "games = collector.collect.remote(num_workers=8, num_eval_workers=2)",
                ),
                (
                    "ray.get(learner.train.remote(200)) # total update steps",
                    WAIT_FOR_DOWN.format(seen=str(seen), up_for=UP_FOR) + "ray.get(learner.train.remote(2))" + WAIT,
                ),
            ],
            tmp_path,
            env,
        )
        requests = len(chat.requests)
    ladder = json.loads(stdout.split(LADDER_MARK, 1)[1])
    rows = _metrics(tmp_path / "runs" / "demo")
    assert [r["learner/step"] for r in rows] == [1, 2]  # training finished, the endpoint down for its later part
    assert requests > UP_FOR, f"the evaluation games made {requests} requests: none met the endpoint down"
    # games were played and rated while it was up (a failed game is never rated)
    assert "google/gemini-2.0-flash-lite-001" in {entry["agent"] for entry in ladder}
