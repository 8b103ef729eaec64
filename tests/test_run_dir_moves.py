"""A run's own files name its paths absolute or relative to its directory: resumed from another working directory,
and moved or copied elsewhere, it goes on from where it stopped, keeping its start-of-run evaluation; with its
newest state cut in half by a lost write, it goes on from the state before. The run is a LoRA warm start with a KL
penalty whose anchor moves halfway to the policy every step: the penalty starts at zero (it measures the distance from
the warm start, not the base model), and the moved anchor is saved for the resume."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from unstable.cli.main import main
from unstable.runtime import resume
from unstable.tracking import keys

from .runs import EXAMPLE, tiny_run

pytestmark = pytest.mark.slow  # runs of unstable train


def _steps(run_dir: Path) -> list[int]:
    """The learner steps logged, after checking the final row holds the start-of-run evaluation of row 0."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["final"] is True and rows[-1]["eval_start"]["games"] == 2  # a resumed run lost it before
    return [r[keys.STEP] for r in rows if keys.STEP in r]


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.long  # a minute or more of runs: scheduled first
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
        "warm_start.learning_rate=0.01",  # a few SFT updates that move the adapter well away from the base
        "learner.policy.lora={lora_rank: 4, lora_alpha: 8, target_modules: [q_proj, v_proj, lm_head]}",
        # the KL coefficient scheduled over updates (0.1, 0.2, 0.3 at steps 1-3), resumed where it was
        "learner.algorithm.args={ref_kl_coef: [[0, 0.1], [2, 0.3]], ref_mix: 0.5, importance_cap: 2.0}",
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
    rows = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines()]
    first, second = ([row for row in rows if row.get(keys.STEP) == step][0] for step in (1, 2))
    assert first[keys.REF_KL] < 1e-6  # the penalty measures the distance from the warm start, not the base model
    assert 0.0 <= second[keys.IMPORTANCE_CAPPED_FRACTION] <= 1.0  # stale samples were reweighted
    assert [first[keys.REF_KL_COEF], second[keys.REF_KL_COEF]] == pytest.approx([0.1, 0.2])
    before, state = (resume.load_part(moved / "state" / f"step-{step}", "learner") for step in (1, 2))
    assert state["algorithm"] == {"updates": 2}  # step 2 was made by the resumed session
    for name, weight in state["reference"].items():  # the anchor moved halfway to the policy of step 2, saved
        torch.testing.assert_close(weight, (before["reference"][name] + state["policy"][name]) / 2, msg=name)
    assert not (launch / "runs" / "moved").exists() and not (other / "runs").exists()  # nothing written elsewhere

    # the newest state cut in half, as a disk that lost its last writes leaves it: the run goes on from step 1's
    cut = moved / "state" / "step-2" / "pool.safetensors"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    assert main(["train", "--resume", str(moved), "--set", "learner.num_steps=3"]) == 0
    assert _steps(moved) == [0, 1, 2, 3]  # step 2 redone and logged once
    rows = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert [row[keys.REF_KL_COEF] for row in rows if row.get(keys.STEP, 0) > 0] == pytest.approx([0.1, 0.2, 0.3])
