"""Config loading: YAML and overrides validate, and every error names the field, the value and the rule."""

import json
from pathlib import Path

import pytest

from unstable.config import ConfigError, load_config, validate_config

EXAMPLE = Path(__file__).parent.parent / "examples" / "tictactoe-tiny.yaml"


def _minimal(**sections):
    data = {"model": {"path": "m"}, "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]}}
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return data


def test_example_config_loads_with_overrides():
    cfg = load_config(EXAMPLE, ["learner.num_steps=3", "run.name=x"])
    assert cfg.learner.num_steps == 3 and cfg.run.name == "x"
    spec = cfg.collector.training_envs[0].to_spec()
    assert (spec.env_id, spec.num_players, spec.prompt_template) == ("TicTacToe-v0-train", 2, "qwen3-zs")


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"collector": {"training_envs": [["TicTacToe-v9", 2, "qwen3-zs"]]}}, "collector.training_envs.0.env_id"),
        ({"collector": {"training_envs": [["TicTacToe-v0-train", 2, "chatml"]]}}, "'default', 'plain', 'qwen3-zs'"),
        ({"learner": {"batch_size": 0}}, "learner.batch_size = 0"),
        ({"learner": {"algorithm": {"name": "dpo"}}}, "unknown algorithm 'dpo'; valid:"),
        ({"inference": {"backend": "tgi"}}, "inference.backend = 'tgi'"),
        ({"pool": {"sample_mode": "fixed"}}, "fixed_opponents"),
        ({"pool": {"fixed_opponents": ["grandmaster"]}}, "grandmaster"),
        ({"buffer": {"final_reward_transforms": [{"name": "Nope"}]}}, "unknown reward transform 'Nope'"),
        ({"learner": {"batch_sise": 3}}, "learner.batch_sise = 3: Extra inputs are not permitted"),
        ({"tracker": {"wandb": "sometimes"}}, "tracker.wandb = 'sometimes'"),
        ({"tracker": {"window_games": 0}}, "tracker.window_games = 0"),
        ({"warm_start": {"agents": ["random", "grandmaster"]}}, "unknown scripted agent 'grandmaster'"),
        ({"warm_start": {"agents": ["random"]}}, "one scripted agent per seat of the first training env (2 players)"),
        ({"warm_start": {"games": 0}}, "warm_start.games = 0"),
    ],
)
def test_bad_values_name_the_field(sections, expected):
    with pytest.raises(ConfigError) as err:
        validate_config(_minimal(**sections))
    assert expected in str(err.value)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(EXAMPLE, ["learner.num_steps"])


def test_cli_reports_config_errors_without_traceback(tmp_path, capsys):
    from unstable.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {path: m}\ncollector: {training_envs: [[Nope-v0, 2, qwen3-zs]]}\n")
    assert main(["train", str(bad)]) == 2
    assert "collector.training_envs.0.env_id = 'Nope-v0'" in capsys.readouterr().err


def test_full_finetuning_refuses_a_pool_that_plays_past_checkpoints():
    data = {
        "model": {"path": "m"},
        "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]},
        "pool": {"sample_mode": "lagged", "max_active_lora": 3},
        "learner": {"lora": None},
    }
    with pytest.raises(ConfigError, match="full fine-tuning .* serves only the newest one"):
        validate_config(data)
    data["learner"]["lora"] = {"lora_rank": 4}
    assert validate_config(data).pool.sample_mode == "lagged"


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "examples").glob("*.yaml")), ids=str)
def test_every_example_config_validates(path):
    cfg = load_config(path)
    if path.name == "single-gpu.yaml":  # both actors on one GPU, on cuda, the engine within its share
        assert cfg.inference.num_gpus + cfg.learner.num_gpus == 1
        assert cfg.inference.device == cfg.learner.device == "cuda"


def test_the_lora_rank_served_is_the_largest_the_run_declares(tmp_path):
    def adapter(name, **config):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    assert load_config(EXAMPLE).served_lora_rank is None  # full fine-tuning against the random agent
    assert load_config(EXAMPLE, ["learner.lora={lora_rank: 96}"]).served_lora_rank == 96
    opponent = adapter("opponent", r=8, rank_pattern={"q_proj": 200})  # a LoRA opponent with its own ranks
    with_opponent = ["learner.lora={lora_rank: 96}", f"pool.fixed_opponents=[random, {opponent}]"]
    assert load_config(EXAMPLE, with_opponent).served_lora_rank == 200
    start = ["learner.lora={lora_rank: 4}", f"learner.initial_lora_path={adapter('start', r=128)}"]
    assert load_config(EXAMPLE, start).served_lora_rank == 128
