"""Config loading: YAML and overrides validate, and every error names the field, the value and the rule."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
        ({"collector": {"num_workers": 100000000000}}, "collector.num_workers = 100000000000: Input should be less"),
        ({"collector": {"num_eval_workers": 10**6}}, "collector.num_eval_workers = 1000000: Input should be less"),
        ({"evaluation": {"games_at_start": 10**9}}, "evaluation.games_at_start = 1000000000: Input should be less"),
        ({"evaluation": {"games_at_end": 10**9}}, "evaluation.games_at_end = 1000000000: Input should be less"),
        ({"warm_start": {"games": 10**9}}, "warm_start.games = 1000000000: Input should be less"),
        ({"inference": {"num_threads": 10**6}}, "inference.num_threads = 1000000: Input should be less"),
        ({"learner": {"num_threads": 10**6}}, "learner.num_threads = 1000000: Input should be less"),
        ({"inference": {"num_actors": 10**6}}, "inference.num_actors = 1000000: Input should be less"),
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
        "learner": {"policy": {"lora": None}},
    }
    with pytest.raises(ConfigError, match="full fine-tuning .* serves only the newest one"):
        validate_config(data)
    data["learner"]["policy"]["lora"] = {"lora_rank": 4}
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

    assert load_config(EXAMPLE).served_lora_rank is None  # full fine-tuning against scripted agents
    assert load_config(EXAMPLE, ["learner.policy.lora={lora_rank: 96}"]).served_lora_rank == 96
    opponent = adapter("opponent", r=8, rank_pattern={"q_proj": 200})  # a LoRA opponent with its own ranks
    with_opponent = ["learner.policy.lora={lora_rank: 96}", f"pool.fixed_opponents=[random, {opponent}]"]
    assert load_config(EXAMPLE, with_opponent).served_lora_rank == 200
    start = ["learner.policy.lora={lora_rank: 4}", f"learner.policy.initial_lora_path={adapter('start', r=128)}"]
    assert load_config(EXAMPLE, start).served_lora_rank == 128


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: {path: m\ncollector: [\n", "is not valid YAML: line 2, column 10: expected ',' or '}', but got ':'"),
        ("model:\n\tpath: m\n", "line 2, column 1: a tab; tabs are not allowed in YAML indentation"),
        ("- model\n- collector\n", "holds a list, not a mapping of sections (run:, model:, collector:, ...)"),
        ("hello\n", "holds a str, not a mapping of sections"),
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        (b"\xff\xfe\x00model".decode("latin-1"), "is not UTF-8 text"),
    ],
)
def test_a_config_file_that_is_no_yaml_mapping_is_one_line_naming_it(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(f"config file {path} ") and expected in message and "\n" not in message


def test_a_config_path_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"^config file {tmp_path} is a directory, not a YAML file$"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("learner.num_steps.x=1", "override 'learner.num_steps.x=1': learner.num_steps is 400, not a section"),
        ("learner.num_steps=[1", "override 'learner.num_steps=[1': the value is not valid YAML"),
    ],
)
def test_an_override_that_does_not_fit_is_one_line(override, expected):
    with pytest.raises(ConfigError) as error:
        load_config(EXAMPLE, [override])
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


CLI_CONFIG = """run: {{dir: {runs}, name: r}}
model: {{path: org/model}}
collector: {{training_envs: [[TicTacToe-v0-train, 2, qwen3-zs]]}}
"""


def _model_dir(root: Path, config_json: str | None = '{"model_type": "qwen3"}', tokenizer: bool = True) -> Path:
    """A model directory holding `config_json` as config.json (None: none) and a tokenizer file if `tokenizer`."""
    root.mkdir()
    if config_json is not None:
        (root / "config.json").write_text(config_json)
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    return root


@pytest.mark.parametrize(
    ("config_json", "tokenizer", "build_tiny", "expected"),
    [
        ('{"model_type": ', True, False, "config.json is not valid JSON: line 1, column 16: Expecting value"),
        ('{"model_type": ', True, True, "config.json is not valid JSON"),
        ("[1, 2]", True, False, "config.json holds a list, not a JSON object"),
        (None, True, False, "no config.json in the model directory"),
        ('{"model_type": "qwen3"}', False, False, "no tokenizer in the model directory"),
    ],
)
def test_a_model_directory_that_cannot_load_is_refused_at_validation(
    tmp_path, config_json, tokenizer, build_tiny, expected
):
    model = _model_dir(tmp_path / "model", config_json, tokenizer)
    with pytest.raises(ConfigError) as error:
        validate_config(_minimal(model={"path": str(model), "build_tiny_if_missing": build_tiny}))
    assert f"model.path = '{model}': " in str(error.value) and expected in str(error.value)


def test_a_model_directory_that_loads_or_is_to_be_built_passes(tmp_path):
    assert validate_config(_minimal(model={"path": str(_model_dir(tmp_path / "model"))}))
    empty = _model_dir(tmp_path / "empty", None, tokenizer=False)
    assert validate_config(_minimal(model={"path": str(empty), "build_tiny_if_missing": True}))


def test_the_config_a_runs_actors_get_names_its_local_paths_absolutely(tmp_path, monkeypatch):
    """On a Ray cluster a run joins, its actors' working directory is not the driver's: a relative model or adapter
    path (`.cache/tiny-qwen3`, a warm start under `run.dir: runs`) reaches them absolute; a hub name stays as it is."""
    from unstable.config.schema import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    _model_dir(tmp_path / "model")
    (tmp_path / "adapter").mkdir()
    cfg = validate_config(_minimal(model={"path": "model"}, learner={"policy": {"initial_lora_path": "adapter"}}))
    absolute = with_absolute_paths(cfg)
    assert absolute.model.path == str(tmp_path / "model")
    assert absolute.learner.policy.initial_lora_path == str(tmp_path / "adapter")
    assert absolute.learner == cfg.learner.model_copy(update={"policy": absolute.learner.policy})  # nothing else
    hub = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": "org/model"})})
    assert with_absolute_paths(hub).model.path == "org/model"


def test_a_run_dir_that_cannot_be_made_is_refused_before_anything_is_created(tmp_path):
    from unstable.runtime.driver import check_run_dir

    (tmp_path / "a-file").write_text("x")
    for where in (tmp_path / "a-file", tmp_path / "a-file" / "deeper"):
        with pytest.raises(
            ConfigError, match=f"^run.dir = '{where}': cannot make the run directory .*a-file is a file"
        ):
            check_run_dir(validate_config(_minimal(run={"dir": str(where), "name": "r"})))
    check_run_dir(validate_config(_minimal(run={"dir": str(tmp_path / "new" / "runs")})))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# root writes into a read-only directory; without these capabilities it is refused as any user is (util-linux setpriv)
AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


def _train_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m unstable.cli.main train ARGS` in `tmp_path`, as a user runs it (root without its override of file
    permissions)."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    command = [*AS_A_USER, sys.executable, "-m", "unstable.cli.main", "train", *args]
    env = os.environ | {"PYTHONPATH": src}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "text", "args", "expected"),
    [
        ("a directory", None, ["adir"], "config file adir is a directory, not a YAML file"),
        ("an unclosed bracket", "model: {path: m\ncollector: [\n", ["c.yaml"], "c.yaml is not valid YAML: line 2"),
        ("a tab", "model:\n\tpath: m\n", ["c.yaml"], "tabs are not allowed in YAML indentation"),
        ("a broken model", None, ["c.yaml", "--set", "model.path=model"], "config.json is not valid JSON"),
        ("run.dir under a file", None, ["c.yaml", "--set", "run.dir=adir/f"], "adir/f is a file"),
        ("run.dir in a read-only directory", None, ["c.yaml", "--set", "run.dir=readonly/runs"], "is not writable"),
        ("absurd games in flight", None, ["c.yaml", "--set", "collector.num_workers=100000000000"], "less than"),
    ],
)
def test_unstable_train_refuses_bad_input_in_one_line_and_creates_nothing(tmp_path, case, text, args, expected):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "f").write_text("a file")
    (tmp_path / "readonly").mkdir(mode=0o500)
    _model_dir(tmp_path / "model", '{"model_type": ')
    (tmp_path / "c.yaml").write_text(text if text is not None else CLI_CONFIG.format(runs=tmp_path / "runs"))
    before = sorted(tmp_path.rglob("*"))
    done = _train_cli(tmp_path, *args)
    assert done.returncode == 2, (case, done.stderr[-2000:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, (case, done.stderr)
    assert expected in done.stderr and "Traceback" not in done.stderr and not done.stdout, (case, done.stderr)
    assert sorted(tmp_path.rglob("*")) == before, case  # no run directory, nothing else either


def test_every_subcommand_refuses_a_missing_or_wrong_path_in_one_line(tmp_path, capsys):
    from unstable.cli.main import main

    (tmp_path / "a-file").write_text("x")
    broken = _model_dir(tmp_path / "broken", '{"model_type": ')
    model = _model_dir(tmp_path / "model")
    run = Path(__file__).parent / "fixtures" / "recorded_run"
    cases = [
        (["build-tiny-model", f"{tmp_path}/a-file/tiny"], "a-file is a file"),
        (["eval", "--model", f"{tmp_path}/no/such/model"], "no such model directory"),
        (["eval", "--model", str(broken)], "config.json is not valid JSON"),
        (["eval", "--model", str(model), "--adapter", f"{tmp_path}/no-adapter"], "no such adapter directory"),
        (["eval", "--model", str(model), "--out", f"{tmp_path}/a-file/report.json"], "a-file is a file"),
        (["eval", "--model", f"{tmp_path}/a-file/tiny", "--build-tiny"], "a-file is a file"),
        (["eval", "--model", str(model), "--threads", "1000000"], "--threads 1000000: at least 1, at most 1024"),
        (["sft", "--model", f"{tmp_path}/no/such/model"], "no such model directory"),
        (["sft", "--model", str(broken)], "config.json is not valid JSON"),
        (["sft", "--model", str(model), "--out-dir", f"{tmp_path}/a-file/sft"], "a-file is a file"),
        (["dashboard", "--once", f"{tmp_path}/a-file"], "is not a directory"),
        (["dashboard", "--once", f"{tmp_path}/no-run"], "does not exist"),
        (["report", f"{tmp_path}/no-run"], "does not exist"),
        (["report", str(run), "--out", f"{tmp_path}/a-file/report"], "a-file is a file"),
        (["train", "--resume", f"{tmp_path}/a-file"], "does not exist"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "broken", "model"]


def test_the_original_apis_learner_keywords_default_to_the_yaml_learners_values():
    """`StandardLearner(...)` without a keyword trains as `learner:` without that field does: one set of defaults."""
    from unstable.learner import LearnerConfig, LoraConfig
    from unstable.runtime.original_api import learner_config_from_original_api

    assert learner_config_from_original_api() == LearnerConfig()
    full = learner_config_from_original_api(full_finetune=True, activation_checkpointing=True, batch_size=8)
    assert full == LearnerConfig(policy={"lora": None, "gradient_checkpointing": True}, batch_size=8)
    assert learner_config_from_original_api(lora_cfg={"lora_rank": 4}).policy.lora == LoraConfig(lora_rank=4)


def test_the_learner_is_split_by_owner_and_a_policy_loads_from_its_part_alone(tiny_model_dir):
    """`learner.policy` (what loading and training the model needs) and `learner.optimizer` are their own sections:
    evaluation and SFT load a model from `PolicyConfig` alone, without the loop's or the optimizer's settings."""
    from unstable.learner import LearnerConfig, OptimizerConfig, PolicyConfig, PolicyModel

    parts = set(PolicyConfig.model_fields) | set(OptimizerConfig.model_fields)
    assert not parts & set(LearnerConfig.model_fields)  # each setting in one place
    policy = PolicyModel(tiny_model_dir, PolicyConfig(lora=None))
    policy.load()
    assert policy.trainable_parameters() and policy.device == "cpu"


def test_a_learner_field_has_one_spelling_and_an_old_run_directory_is_upgraded_on_resume(
    tiny_model_dir, tmp_path, caplog
):
    """A policy or optimizer field written flat under `learner:` is refused, naming its section (it was a second
    spelling of every such field); the original API's keywords and a run directory's `config.yaml` written before the
    split are moved into the sections, the latter with a warning, and a field given both ways is one error."""
    from unstable.learner import LearnerConfig, OptimizerConfig, PolicyConfig
    from unstable.runtime.original_api import learner_config_from_original_api

    with pytest.raises(ValueError, match=r"learning_rate belongs in learner.optimizer \(learner.optimizer\."):
        LearnerConfig(learning_rate=0.1)
    nested = LearnerConfig(batch_size=8, optimizer={"learning_rate": 0.1}, policy={"lora": None, "max_train_len": 64})
    assert learner_config_from_original_api(learning_rate=0.1, full_finetune=True, max_train_len=64, batch_size=8) == (
        nested
    )
    assert nested.optimizer == OptimizerConfig(learning_rate=0.1) and nested.policy == PolicyConfig(
        lora=None, max_train_len=64
    )
    recorded = Path(__file__).parent / "fixtures" / "recorded_run" / "config.yaml"  # written with flat fields
    old = yaml.safe_load(recorded.read_text())
    assert "learning_rate" in old["learner"] and "lora" in old["learner"]
    old["model"]["path"] = tiny_model_dir
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="belongs in learner.policy"):
        load_config(tmp_path / "config.yaml")  # as a new run's config
    cfg = load_config(tmp_path / "config.yaml", run_dir=tmp_path)  # as the run's own, resumed
    assert cfg.learner.optimizer.learning_rate == old["learner"]["learning_rate"] and cfg.learner.policy.lora is None
    assert "moved" in caplog.text and "'learning_rate'" in caplog.text
    mixed = old | {"learner": old["learner"] | {"optimizer": {"learning_rate": 0.5}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(mixed))
    with pytest.raises(ConfigError, match="learning_rate is given both as learner.learning_rate and learner.optimizer"):
        load_config(tmp_path / "config.yaml", run_dir=tmp_path)


def test_a_batch_larger_than_the_buffer_is_refused_by_unstable_train(tmp_path, capsys):
    """The buffer never holds learner.batch_size steps, so the learner would wait forever (and with pacing no game
    starts): `unstable train` refuses it in one line naming both settings."""
    from unstable.cli.main import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {path: m}\ncollector: {training_envs: [[TicTacToe-v0-train, 2, qwen3-zs]]}\n"
        "buffer: {max_buffer_size: 32}\nlearner: {batch_size: 64}\n"
    )
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "learner.batch_size = 64" in err and "buffer.max_buffer_size = 32" in err


def test_with_vines_an_inference_actor_has_a_thread_for_every_vine_a_game_plays_at_once():
    """Vines' requests were not counted in the inference actors' max_concurrency, so control calls (stats, weights)
    queued behind generation."""
    from unstable.collector.config import CollectorConfig
    from unstable.games.vines import MAX_VINES_AT_ONCE

    envs = [["TicTacToe-v0-train", 2, "qwen3-zs"]]
    plain = CollectorConfig(training_envs=envs, num_workers=4, num_eval_workers=2)
    vined = CollectorConfig(training_envs=envs, num_workers=4, num_eval_workers=2, vines={"rollouts": 3})
    assert plain.requests_in_flight() == plain.games_in_flight()
    assert vined.requests_in_flight() == 4 * MAX_VINES_AT_ONCE + 2


def test_command_options_default_to_the_run_configs_settings():
    """`unstable sft`, `eval` and `play` take their settings' defaults from the models a run config validates with
    (`sft` defaulted to 100 games, 3 epochs, batch 32 while `warm_start:` defaults to 800, 2, 16)."""
    from unstable.cli.main import build_parser
    from unstable.inference.config import InferenceConfig
    from unstable.learner.config import LoraConfig, WarmStartConfig

    parser = build_parser()
    sft = parser.parse_args(["sft", "--model", "m"])
    ws, lora = WarmStartConfig(), LoraConfig()
    assert (sft.agents, sft.games, sft.epochs, sft.batch_size, sft.lr, sft.lora_rank) == (
        ws.agents, ws.games, ws.epochs, ws.batch_size, ws.learning_rate, lora.lora_rank,
    )  # fmt: skip
    inference = InferenceConfig()
    for argv in (["eval", "--model", "m"], ["play", "random"]):
        args = parser.parse_args(argv)
        assert (args.temperature, args.max_new_tokens) == (inference.temperature, inference.max_new_tokens)
