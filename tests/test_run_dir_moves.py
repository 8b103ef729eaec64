"""A run's own files name its paths absolute or relative to its directory: resumed from another working directory,
and moved or copied elsewhere, it goes on from where it stopped, keeping its start-of-run evaluation; with its
newest state cut in half by a lost write, it goes on from the state before."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from unstable.cli.main import main
from unstable.tracking import keys

from .runs import EXAMPLE, tiny_run

pytestmark = pytest.mark.slow  # runs of unstable train


def _steps(run_dir: Path) -> list[int]:
    """The learner steps logged, after checking the final row holds the start-of-run evaluation of row 0."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["final"] is True and rows[-1]["eval_start"]["games"] == 2  # a resumed run lost it before
    return [r[keys.STEP] for r in rows if keys.STEP in r]


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_a_run_moved_elsewhere_resumes_from_another_directory_and_finishes(tiny_model_dir, tmp_path, monkeypatch):
    launch, other = tmp_path / "launch", tmp_path / "other"
    launch.mkdir()
    other.mkdir()
    monkeypatch.chdir(launch)
    overrides = tiny_run(
        Path("runs"),  # relative to the launch directory, as a user's `run.dir: runs`
        tiny_model_dir,
        "moved",
        "warm_start.games=8",
        "warm_start.batch_size=8",
        "learner.policy.lora={lora_rank: 4, lora_alpha: 8}",
        "learner.resume_state.every_steps=1",
        "evaluation.games_at_start=2",
    )
    assert main(["train", str(EXAMPLE), *[arg for o in overrides for arg in ("--set", o)]]) == 0
    moved = tmp_path / "elsewhere" / "moved"
    shutil.move(launch / "runs" / "moved", moved)
    config = yaml.safe_load((moved / "config.yaml").read_text())
    assert not Path(config["learner"]["policy"]["initial_lora_path"]).is_absolute()  # relative to the run directory

    monkeypatch.chdir(other)
    assert main(["train", "--resume", str(moved), "--set", "learner.num_steps=2"]) == 0
    assert _steps(moved) == [0, 1, 2]
    assert (moved / "checkpoints" / "ckpt-2" / "adapter_model.safetensors").exists()
    assert not (launch / "runs" / "moved").exists() and not (other / "runs").exists()  # nothing written elsewhere

    # the newest state cut in half, as a disk that lost its last writes leaves it: the run goes on from step 1's
    cut = moved / "state" / "step-2" / "pool.safetensors"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    assert main(["train", "--resume", str(moved), "--set", "learner.num_steps=3"]) == 0
    assert _steps(moved) == [0, 1, 2, 3]  # step 2 redone and logged once
