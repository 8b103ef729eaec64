"""Tests for the offline tiny-model builder (`unstable.models.tiny`)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from unstable.games.moves import legal_moves
from unstable.models import (
    QWEN3_06B_SHAPE,
    TinyShape,
    build_tiny_model,
    build_tokenizer,
    ensure_shaped_model,
    ensure_tiny_model,
    tiny,
    weight_bytes,
)

pytestmark = pytest.mark.slow  # builds models

TICTACTOE_OBS = (
    "You are Player 0 in Tic Tac Toe.\nFor example, '[4]' places your mark in the center cell of the board.\n\n"
    "Player 0 placed their symbol (O) in cell 4.\n\nCurrent Board:\n\n X | 1 | 2 \n---+---+---\n 3 | O | 5 \n"
    "Available Moves: '[1]', '[2]', '[3]', '[5]'"
)
NIM_OBS = (
    "Remove objects with the format '[pile quantity]', e.g. '[0 3]'.\n\n"
    "Current Pile:\n  pile 0: 3\n  pile 1: 0\n  pile 2: 1"
)
CONNECT_FOUR_OBS = (
    "For example: '[col 4]' or '[col 1]'.\n\nBoard state:\n0 1 2 3 4 5 6\n-------------\n"
    ". X . . . . O\n. X . . . . X\n. O . . . . O\n. X . . . . X\n. O . . . . O\n. X . O . . X"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """One default tiny model shared by the read-only tests."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def test_builds_and_loads_like_a_hub_model(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = model.config
    assert config.model_type == "qwen3"
    assert config.head_dim >= 32 and config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer) == 1024
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert (model_dir / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "text", [TICTACTOE_OBS, NIM_OBS, "\\boxed{[4]}", "<think>\nplay [col 3]\n</think>\n\\boxed{[col 3]}"]
)
def test_tokenizer_round_trips_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_special_and_think_tokens_are_single_tokens(tokenizer):
    for token in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]:
        assert tokenizer.tokenize(token) == [token]
    ids = tokenizer.encode("<think>x</think><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_format_strings_tokenize_compactly(tokenizer):
    assert len(tokenizer.encode("\\boxed{[4]}", add_special_tokens=False)) <= 6
    assert len(tokenizer.encode("[col 3]", add_special_tokens=False)) <= 4


def test_left_padding_survives_save_and_load(tokenizer):
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["[4]", TICTACTOE_OBS], padding=True)
    assert batch["input_ids"][0][0] == tokenizer.pad_token_id
    assert batch["attention_mask"][0][0] == 0 and batch["attention_mask"][0][-1] == 1


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Your move."}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nYour move.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not tokenizer.apply_chat_template(messages, tokenize=False).endswith("assistant\n")


def test_sampled_generate_runs(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": TICTACTOE_OBS}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**inputs, do_sample=True, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[0] == 1 and inputs["input_ids"].shape[1] < out.shape[1] <= inputs["input_ids"].shape[1] + 6


def test_same_seed_gives_identical_model(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again")
    first, second = load_file(model_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert (model_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()


def test_other_seed_and_sizes(tmp_path):
    corpus = [TICTACTOE_OBS, NIM_OBS, CONNECT_FOUR_OBS]
    shape = TinyShape(hidden_size=64, num_heads=2, num_kv_heads=1)
    out = build_tiny_model(tmp_path / "m", shape, vocab_size=400, seed=1, corpus=corpus)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 64 and model.config.vocab_size <= 400
    assert len(AutoTokenizer.from_pretrained(out)) == model.config.vocab_size


def test_head_dim_below_32_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "m", TinyShape(head_dim=16))
    assert not (tmp_path / "m").exists()


def test_corpus_replaces_game_text():
    tok = build_tokenizer(vocab_size=512, corpus=["hello world " * 20])
    assert tok.tokenize(" world") == ["Ġworld"]
    assert tok.tokenize("\\boxed{[4]}")[0] == "\\"


def test_rebuild_replaces_existing_dir_cleanly(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    build_tiny_model(out, corpus=[NIM_OBS])
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        build_tiny_model(tmp_path / "m", corpus=[NIM_OBS])
    assert list(tmp_path.iterdir()) == []


def test_ensure_builds_only_when_config_missing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda out, shape, **kw: calls.append((out, kw)) or out)
    out = tmp_path / "m"
    out.mkdir()  # a directory without config.json (e.g. left by someone else) is not a model
    assert ensure_tiny_model(out, seed=3) == out.resolve()
    assert calls == [(out.resolve(), {"seed": 3})]
    (out / "config.json").write_text("{}")
    assert ensure_tiny_model(out, seed=3) == out.resolve()
    assert len(calls) == 1


def test_ensure_keeps_an_existing_model(model_dir):
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(model_dir) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (TICTACTOE_OBS, ["[1]", "[2]", "[3]", "[5]"]),
        ("Your available actions are: '[check]', '[bet]'", ["[check]", "[bet]"]),
        (NIM_OBS, ["[0 1]", "[0 2]", "[0 3]", "[2 1]"]),
        (CONNECT_FOUR_OBS, ["[col 0]", "[col 2]", "[col 3]", "[col 4]", "[col 5]"]),
        ("Rules: valid moves: '[a]'.\nLegal moves: [0], [2]", ["[0]", "[2]"]),
        ("Say something.", []),
    ],
)
def test_legal_moves(observation, expected):
    assert legal_moves(observation) == expected


def test_a_shaped_model_has_the_shape_asked_for_in_bfloat16_on_the_tiny_tokenizer(model_dir, tmp_path):
    """`ensure_shaped_model` (Qwen3-0.6B's shape for the GPU benchmarks; a small shape here) builds once, and
    `weight_bytes` counts each weight once (the tied embeddings as the output projection) at the bytes given."""
    shape = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    shape |= {"head_dim": 32, "intermediate_size": 96, "vocab_size": 2048}
    built = ensure_shaped_model(tmp_path / "shaped", model_dir, shape)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert model.config.vocab_size == 2048 and model.config.hidden_size == 64 and model.config.tie_word_embeddings
    assert all(t.dtype == torch.bfloat16 for t in load_file(built / "model.safetensors").values())
    assert AutoTokenizer.from_pretrained(built).get_vocab() == AutoTokenizer.from_pretrained(model_dir).get_vocab()
    assert weight_bytes(built, 2) == 2 * sum(p.numel() for p in model.parameters())
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_shaped_model(built, model_dir, shape) == built  # already there: not built again
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp
    assert QWEN3_06B_SHAPE["vocab_size"] == 151936 and QWEN3_06B_SHAPE["num_hidden_layers"] == 28


def test_a_larger_shape_builds_and_an_existing_model_of_another_shape_is_refused(tmp_path, model_dir):
    shape = TinyShape(num_layers=3, hidden_size=192, num_heads=6, num_kv_heads=3, intermediate_size=384)
    out = build_tiny_model(tmp_path / "m", shape, corpus=[NIM_OBS])
    config = AutoModelForCausalLM.from_pretrained(out).config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (3, 192, 6)
    assert ensure_tiny_model(out, shape) == out.resolve()  # the same shape: used as it is
    with pytest.raises(ValueError, match="num_layers: 2, wanted 3; hidden_size: 128, wanted 192"):
        ensure_tiny_model(model_dir, shape)  # the default model is never used (nor replaced) for another shape
    (model_dir / tiny.SHAPE_FILE).rename(tmp_path / "kept")  # a model not built as a tiny one (a real model): used
    try:
        assert ensure_tiny_model(model_dir, shape) == model_dir
    finally:
        (tmp_path / "kept").rename(model_dir / tiny.SHAPE_FILE)
    with pytest.raises(ValueError, match="does not divide"):
        TinyShape(num_heads=4, num_kv_heads=3)


def test_build_tiny_model_command_takes_the_shape_and_a_run_config_refuses_a_mismatch(tmp_path, model_dir):
    from unstable.cli.main import main
    from unstable.config import ConfigError, load_config

    from .runs import EXAMPLE

    out = tmp_path / "wide"
    assert main(["build-tiny-model", str(out), "--hidden-size", "64", "--num-heads", "2", "--num-kv-heads", "1"]) == 0
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 64
    assert main(["build-tiny-model", str(tmp_path / "bad"), "--num-kv-heads", "3"]) == 2  # one line, nothing built
    assert not (tmp_path / "bad").exists()
    overrides = [f"model.path={model_dir}", "model.tiny_shape.num_layers=4"]
    with pytest.raises(ConfigError, match="model.tiny_shape .*num_layers: 2, wanted 4"):
        load_config(EXAMPLE, overrides)
    wide = "model.tiny_shape={hidden_size: 64, num_heads: 2, num_kv_heads: 1}"
    assert load_config(EXAMPLE, [f"model.path={out}", wide]).model.tiny_shape.hidden_size == 64
