"""Warm start and evaluation: `unstable sft` teaches a fresh tiny model the answer format, `unstable eval` writes
per-seat W/D/L with Wilson intervals, and a model's Kuhn Poker policy has an exact exploitability."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from unstable.agents.seating import parse_opponent
from unstable.algorithms import ALGORITHMS, SFT
from unstable.cli.main import main
from unstable.collector.demonstrations import generate_sft_steps, supervised_step
from unstable.evaluation.evaluate import (
    evaluate,
    kuhn_exploitability,
    play_matches,
    scoring_policy,
    serving,
    summarize_matches,
)
from unstable.evaluation.probe import SKILLS, skills
from unstable.games.kuhn import FIRST_PLAYER_INFOSETS, INFOSETS, SECOND_PLAYER_INFOSETS, best_response_value
from unstable.inference import InferenceConfig
from unstable.learner import LearnerConfig, LoraConfig
from unstable.learner.sft import sft_learner
from unstable.records import Checkpoint, EnvSpec, GameRecord, Step

from .conftest import built_once

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
KUHN = EnvSpec("KuhnPoker-v0-train", 2, "qwen3-zs")
# the tiny model's random output layer cannot give sharp logits unless the adapter covers it
LORA_TARGETS = [*LoraConfig().target_modules, "lm_head"]
INFERENCE = InferenceConfig(max_new_tokens=8, temperature=1.0, num_threads=None)


@pytest.fixture(scope="module")
def sft_adapter(tiny_model_dir, tmp_path_factory) -> str:
    """`unstable sft` on ~300 random-vs-random TicTacToe moves (LoRA including the output layer), once per test
    run."""
    with built_once(tmp_path_factory, "sft") as out:
        if not out.exists():
            argv = ["sft", "--model", tiny_model_dir, "--games", "40", "--epochs", "4", "--batch-size", "16"]
            argv += ["--lr", "3e-3", "--lora-rank", "8", "--lora-targets", *LORA_TARGETS, "--out-dir", str(out)]
            assert main(argv) == 0
    (adapter,) = (out / "checkpoints").iterdir()
    assert (adapter / "adapter_config.json").exists()
    return str(adapter)


def test_sft_is_a_registered_algorithm_computing_masked_mean_nll(tiny_model_dir):
    def step(prompt, completion):
        zeros = (0.0,) * len(completion)
        return Step(
            "x", 0, 0, "", "", prompt_token_ids=prompt, completion_token_ids=completion, behaviour_logprobs=zeros
        )

    assert ALGORITHMS["sft"] is SFT
    steps = [step((5, 6, 7), (8, 2)), step((5, 9), (10, 11, 2))]
    learner = sft_learner(tiny_model_dir, LearnerConfig(policy={"lora": None}, optimizer={"learning_rate": 1e-3}))
    learner.initialize()
    sums = learner.policy.completion_logprobs(steps)
    reordered = learner.policy.completion_logprobs([steps[1], steps[0], steps[1]])
    assert reordered == pytest.approx([sums[1], sums[0], sums[1]], rel=1e-5)  # a batch of 3 may round unlike one of 2
    loss = learner.train_step(steps)["learner/loss"]
    assert loss == pytest.approx(-sum(sums) / 5, rel=1e-4)  # 5 completion tokens in the batch


def test_generated_steps_are_rendered_prompts_with_format_action_and_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    steps = generate_sft_steps(TICTACTOE, ["random", "random"], 3, tokenizer)
    assert len(steps) >= 15  # a TicTacToe game has at least 5 moves
    for step in steps:
        assert tokenizer.decode(step.completion_token_ids) == f"\\boxed{{{step.action}}}{tokenizer.eos_token}"
        assert tokenizer.decode(step.prompt_token_ids) == step.prompt
        assert step.prompt.endswith("<|im_start|>assistant\n") and step.observation in step.prompt
        assert step.behaviour_logprobs == (0.0,) * len(step.completion_token_ids)


def test_sft_teaches_a_fresh_tiny_model_the_answer_format(tiny_model_dir, sft_adapter):
    def format_rate(adapter):
        report = evaluate(
            tiny_model_dir, TICTACTOE, ["random"], adapter=adapter, games_per_opponent=40, inference=INFERENCE
        )
        return report["opponents"]["random"]["format_ok_rate"], report["opponents"]["random"]["moves"]

    before, _ = format_rate(None)
    after, moves = format_rate(sft_adapter)
    assert before < 0.5
    assert moves >= 60 and after >= 0.95


def test_eval_cli_writes_per_opponent_per_seat_wdl_with_intervals(tiny_model_dir, sft_adapter, tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", tiny_model_dir, "--adapter", sft_adapter, "--games", "4", "--out", str(out)]
    assert main([*argv, "--opponents", "random", "tictactoe-minimax", sft_adapter]) == 0
    assert "tictactoe-minimax" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["adapter"] == sft_adapter and report["env"]["env_id"] == TICTACTOE.env_id
    assert list(report["opponents"]) == ["random", "tictactoe-minimax", sft_adapter]
    for result in report["opponents"].values():
        assert set(result["seats"]) == {"seat_0", "seat_1"}
        for wdl in [*result["seats"].values(), result["all_seats"]]:
            assert wdl["wins"] + wdl["draws"] + wdl["losses"] == wdl["games"]
            for key in ("win", "draw", "loss"):
                low, high = wdl[f"{key}_ci"]
                assert 0 <= low <= wdl[f"{key}_rate"] <= high <= 1
        assert result["seats"]["seat_0"]["games"] + result["seats"]["seat_1"]["games"] + result["failed"] == 4


def test_an_evaluation_plays_the_same_games_one_at_a_time_and_sixteen_at_once(tiny_model_dir, sft_adapter):
    """Every seat samples from seeds of its own game and seat: the games repeat however they interleave in the
    engine (one shared sampling stream made a checkpoint's evaluation differ from run to run)."""
    model, opponent = Checkpoint("model", sft_adapter), parse_opponent(sft_adapter)  # both seats sample
    with serving(tiny_model_dir, INFERENCE, adapters=2) as (server, tokenizer):
        plays = [
            play_matches(server, model, TICTACTOE, opponent, 16, tokenizer=tokenizer, seed=3, concurrency=n)
            for n in (1, 16)
        ]
    moves = [[[step.completion_token_ids for step in record.steps] for record in records] for records in plays]
    assert moves[0] == moves[1] and any(moves[0])


def test_summarize_matches_counts_outcomes_per_seat():
    def game(seat, rewards, error=None):
        return GameRecord("x", 0, {0: "a", 1: "b"}, (), rewards, learner_player_ids=(seat,), error=error)

    records = [game(0, {0: 1, 1: -1}), game(1, {0: 1, 1: -1}), game(0, {0: 0, 1: 0}), game(1, {}, "env crashed")]
    summary = summarize_matches(records)
    assert summary["seats"]["seat_0"]["wins"] == 1 and summary["seats"]["seat_0"]["draws"] == 1
    assert summary["seats"]["seat_1"]["losses"] == 1 and summary["failed"] == 1
    assert summary["all_seats"]["games"] == 3


def _max_exploitability() -> float:
    """The largest exploitability of any strategy: best-response values are convex in the strategy, so
    each is largest at a pure strategy, and each depends only on one player's part."""
    pure = lambda keys: [dict(zip(keys, c)) for c in itertools.product((0, 1), repeat=len(keys))]  # noqa: E731
    vs_second = max(
        best_response_value(s | dict.fromkeys(FIRST_PLAYER_INFOSETS, 0), 0) for s in pure(SECOND_PLAYER_INFOSETS)
    )
    vs_first = max(
        best_response_value(s | dict.fromkeys(SECOND_PLAYER_INFOSETS, 0), 1) for s in pure(FIRST_PLAYER_INFOSETS)
    )
    return (vs_second + vs_first) / 2


def test_kuhn_exploitability_of_a_model_policy(tiny_model_dir):
    result = kuhn_exploitability(tiny_model_dir, KUHN)
    strategy = result["strategy"]
    assert list(strategy) == list(INFOSETS)
    assert all(0 < p < 1 for p in strategy.values())
    assert 0 <= result["exploitability"] <= _max_exploitability()

    # cross-check one information set against a plain forward pass of the same tokens
    from unstable.games.kuhn import kuhn_information_sets

    info = next(kuhn_information_sets(KUHN.env_id))
    policy = scoring_policy(tiny_model_dir)
    scores = {}
    for action in info.legal_actions:
        step = supervised_step(Step(KUHN.env_id, 0, 0, info.observation, action), KUHN, policy.tokenizer)
        ids = torch.tensor([step.prompt_token_ids + step.completion_token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(policy.model(ids).logits[0, :-1], -1)
        first = len(step.prompt_token_ids) - 1
        scores[action] = sum(logp[first + j, t].item() for j, t in enumerate(step.completion_token_ids))
    p_aggressive = 1 / (1 + math.exp(scores["[check]"] - scores["[bet]"]))
    assert strategy[info.key] == pytest.approx(p_aggressive, rel=1e-4)


def test_eval_cli_reports_kuhn_exploitability(tiny_model_dir, tmp_path):
    out = tmp_path / "kuhn.json"
    argv = ["eval", "--model", tiny_model_dir, "--env", "KuhnPoker-v0-train", "--opponents", "kuhn-nash"]
    assert main([*argv, "--games", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert 0 <= report["kuhn"]["exploitability"] <= _max_exploitability()
    assert set(report["kuhn"]["strategy"]) == set(INFOSETS)


def test_probe_skills_are_the_mean_mass_on_each_skills_cells_beside_a_uniform_choice():
    empty, threats = " " * 9, "OO XX    "  # the empty board; O to move wins at 2 (a row), X would at 5
    blocked = "OX  O    "  # X to move: O would win at 8 (the diagonal), X has no win, so X must block at 8
    uniform = [1 / 9] * 9
    on_2 = [0.5 if c in (0, 2) else 0.0 for c in range(9)]  # half on the winning cell, half on a taken one
    on_8 = [1.0 if c == 8 else 0.0 for c in range(9)]
    result = skills([("", empty), ("", threats), ("", blocked)], [uniform, on_2, on_8])
    assert result["center on the empty board"] == {"policy": 1 / 9, "uniform": 1 / 9, "positions": 1}
    assert result["win"] == result["win on a row"] == {"policy": 0.5, "uniform": 1 / 5, "positions": 1}
    assert result["block"] == {"policy": 1.0, "uniform": 1 / 6, "positions": 1}
    assert result["occupied"]["positions"] == 3 and result["occupied"]["uniform"] == 0
    assert result["occupied"]["policy"] == pytest.approx(0.5 / 3)
    assert list(result) == ["occupied", "center on the empty board", "win", "win on a row", "block"]
    assert set(result) <= set(SKILLS)


def test_eval_cli_adds_the_tictactoe_skill_probe(tiny_model_dir, tmp_path, capsys):
    """`unstable eval --probe N`: the probe of the checkpoint at N positions of random play, in the report and its
    table; the masses are probabilities and the occupied cells' uniform reference is 0."""
    out = tmp_path / "probe.json"
    argv = ["eval", "--model", tiny_model_dir, "--env", "TicTacToe-v0", "--games", "2", "--probe", "24"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "TicTacToe skill probe" in printed and "center on the empty board" in printed
    probe = json.loads(out.read_text())["probe"]
    assert probe["positions"] == 24 and probe["seed"] == 0
    assert set(probe["skills"]) <= set(SKILLS) and probe["skills"]["occupied"]["positions"] == 24
    assert probe["skills"]["occupied"]["uniform"] == 0 and "center on the empty board" in probe["skills"]
    assert all(0 <= skill["policy"] <= 1 and 0 <= skill["uniform"] <= 1 for skill in probe["skills"].values())


def test_cli_rejects_unknown_opponents_and_envs(tiny_model_dir):
    with pytest.raises(SystemExit):
        main(["eval", "--model", tiny_model_dir, "--opponents", "no-such-agent"])
    with pytest.raises(SystemExit):
        main(["sft", "--model", tiny_model_dir, "--env", "NoSuchGame-v0"])


@pytest.mark.parametrize("lora", [None, {"lora_rank": 4, "target_modules": ["q_proj", "lm_head"]}])
def test_run_config_warm_start_trains_first_and_rl_starts_from_its_checkpoint(tiny_model_dir, tmp_path, lora):
    from unstable.config import validate_config
    from unstable.runtime.driver import warm_start

    cfg = validate_config(
        {
            "model": {"path": tiny_model_dir},
            "collector": {"training_envs": [["TicTacToe-v0-train", 2, "qwen3-zs"]]},
            "learner": {"policy": {"lora": lora}},
            "warm_start": {"agents": ["random", "tictactoe-minimax"], "games": 2, "epochs": 1, "batch_size": 8},
        }
    )
    rows = []
    started = warm_start(cfg, tmp_path, on_epoch=rows.append)
    assert [row["epoch"] for row in rows] == [1] and rows[0]["moves"] > 0
    (checkpoint,) = (tmp_path / "warm-start" / "checkpoints").iterdir()
    if lora is None:  # full fine-tuning: RL's base model is the warm start
        assert started.model.path == str(checkpoint) and (checkpoint / "config.json").exists()
    else:  # LoRA: RL's first adapter is the warm start's, on the same base
        assert started.model.path == tiny_model_dir and started.learner.policy.initial_lora_path == str(checkpoint)
        assert (checkpoint / "adapter_config.json").exists()
    assert cfg.model.path == tiny_model_dir and cfg.learner.policy.initial_lora_path is None  # the input is not edited
