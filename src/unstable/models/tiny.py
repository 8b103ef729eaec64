"""Build a tiny, randomly initialised Qwen3-style model with a game-trained tokenizer, fully offline; and a random
model of a real model's shape (Qwen3-0.6B) on that tokenizer, for measuring speed at a real model's size.

The result is a normal Hugging Face model directory (``config.json``, ``model.safetensors``,
``generation_config.json`` and tokenizer files) that ``AutoModelForCausalLM``, ``AutoTokenizer``
and vLLM load like any hub checkpoint. It exists so that the whole self-play pipeline can be run
and tested on a CPU without downloading anything.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import tempfile
from collections.abc import Iterable, Sequence

from pydantic import Field, model_validator

from unstable import atomic
from unstable.settings import Settings

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
MAX_POSITIONS = 4096
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
THINK_TOKENS = (THINK_START, THINK_END)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML (Qwen-style) Jinja chat template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message."""

DEFAULT_ENV_IDS = (
    "TicTacToe-v0-train",
    "KuhnPoker-v0-train",
    "Nim-v0-train",
    "ConnectFour-v0-train",
    "PigDice-v0-train",
    "IteratedPrisonersDilemma-v0-train",
    "SimpleNegotiation-v0-train",
    "Poker-v0-train",
    "LiarsDice-v0-train",
    "Breakthrough-v0-train",
    "Briscola-v0-train",
    "Golf-v0-train",
    "TruthAndDeception-v0-train",
    "IndianPoker-v0-train",
)
"""Games whose text trains the tokenizer: the core games first, then others that add enough vocabulary
to fill a 1024-token BPE. Games whose moves :func:`unstable.games.moves.legal_moves` cannot read are
played with ``[0]``, which usually ends them after an invalid move; their rules text is what matters."""

QWEN3_06B_SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
}
"""Qwen3-0.6B's sizes (from its ``config.json``): the GPU benchmarks measure a random model of this shape."""

_SNIPPET_REPEATS = 10  # weight of the format snippets against the game text, so they earn their own merges


def _play_random_game(env_id: str, rng: random.Random, max_turns: int) -> list[str]:
    """Play one two-player game with uniformly random legal moves (at most ``max_turns`` turns).

    Returns every action plus the last observation each player saw; TextArena's ``-train``
    observations already hold the whole game so far, so earlier ones would only repeat text.
    """
    from unstable.games.moves import legal_moves
    from unstable.games.registry import make_env

    env = make_env(env_id)
    env.reset(num_players=2, seed=rng.randrange(2**31))
    last_seen, actions = {}, []
    for _ in range(max_turns):
        player_id, observation = env.get_observation()
        last_seen[player_id] = observation
        actions.append(rng.choice(legal_moves(observation) or ["[0]"]))
        done, _ = env.step(actions[-1])
        if done:
            break
    env.close()
    return [*last_seen.values(), *actions]


def game_corpus(
    env_ids: Sequence[str] = DEFAULT_ENV_IDS, *, games_per_env: int = 30, max_turns: int = 24, seed: int = 0
) -> list[str]:
    """Text from random-play TextArena games: the players' final observations and all actions, game by game.

    Deterministic for a given ``seed``. TextArena reseeds the global ``random`` module on every reset,
    so its state is saved and restored around the games.
    """
    rng = random.Random(seed)
    global_state = random.getstate()
    try:
        return [
            text
            for env_id in env_ids
            for _ in range(games_per_env)
            for text in _play_random_game(env_id, rng, max_turns)
        ]
    finally:
        random.setstate(global_state)


def _format_snippets() -> list[str]:
    """Action, answer-format and chat strings the model will read and emit during self-play."""
    actions = [f"[{i}]" for i in range(10)] + [f"[col {i}]" for i in range(7)]
    actions += [f"[{pile} {q}]" for pile in range(3) for q in range(1, 8)] + ["[check]", "[bet]", "[call]", "[fold]"]
    answers = [
        f"{THINK_START}\nI will play {a} because it is a legal move.\n{THINK_END}\n\\boxed{{{a}}}" for a in actions
    ]
    prompt = (
        "You are playing a two-player zero-sum game. Make valid actions to win.\nObservation: Your move.\n"
        "Please reason step by step, and put your final answer within \\boxed{}."
    )
    chats = [f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n" for answer in answers]
    return actions + [f"\\boxed{{{a}}}" for a in actions] + chats


def _train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` with the ChatML special tokens and ``<think>`` tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *THINK_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # As in Qwen3, <think> and </think> keep their ids but are not "special", so decoding with
    # skip_special_tokens=True keeps the reasoning markers.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tokenizer


def build_tokenizer(vocab_size: int = 1024, corpus: Iterable[str] | None = None, seed: int = 0):
    """Train the tiny model's tokenizer and wrap it as a left-padding ``PreTrainedTokenizerFast``.

    ``corpus`` replaces the generated random-play game text (whose games ``seed`` picks); the
    action/``\\boxed{}``/``<think>``/chat snippets are always added so those strings tokenize compactly.
    """
    from transformers import PreTrainedTokenizerFast

    texts = list(game_corpus(seed=seed) if corpus is None else corpus) + _format_snippets() * _SNIPPET_REPEATS
    return PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(texts, vocab_size),
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )


def _build_model(tokenizer, seed: int, initializer_range: float, **sizes):
    """A randomly initialised float32 ``Qwen3ForCausalLM`` sized by ``sizes`` (its vocabulary the tokenizer's
    unless ``sizes`` names ``vocab_size``), seeded with ``seed``; weights are drawn with standard deviation
    ``initializer_range``."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    pad_id = tokenizer.pad_token_id
    config = Qwen3Config(
        vocab_size=sizes.pop("vocab_size", len(tokenizer)),
        tie_word_embeddings=True,
        max_position_embeddings=MAX_POSITIONS,
        dtype="float32",
        bos_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        initializer_range=initializer_range,
        **sizes,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad_id
    )
    return model


def _save(out_dir: pathlib.Path, tokenizer, model, extra_files: dict[str, str] | None = None) -> pathlib.Path:
    """Write the model, its tokenizer and `extra_files` (name: text) to a temporary sibling directory and rename it
    to ``out_dir``, so ``out_dir`` is never half-built; an existing ``out_dir`` is replaced."""
    # a unique name, not out_dir.tmp: two processes may build the same model at once
    building = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    with atomic.replace_dir(out_dir, building):
        tokenizer.save_pretrained(building)
        model.save_pretrained(building, safe_serialization=True)
        for name, text in (extra_files or {}).items():
            (building / name).write_text(text)
        building.chmod(0o755)  # mkdtemp makes it owner-only
    return out_dir


HF_NAMES = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
}
"""The Hugging Face `Qwen3Config` name of each `TinyShape` field whose name differs."""
SHAPE_FILE = "tiny_shape.json"
"""The file in a tiny model's directory that records the `TinyShape` it was built with."""


class TinyShape(Settings):
    """The tiny model's size (`build_tiny_model`): the defaults make the 2-layer model of the demo and the tests;
    larger shapes make the model-size ladder's rungs."""

    num_layers: int = Field(2, ge=1, le=64, description="decoder layers")
    hidden_size: int = Field(128, ge=16, description="width of the residual stream")
    num_heads: int = Field(4, ge=1, description="query heads per layer")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads per layer (a divisor of num_heads)")
    head_dim: int = Field(32, ge=32, description="width of each head (vLLM's CPU attention needs at least 32)")
    intermediate_size: int = Field(256, ge=1, description="width of each layer's MLP")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyShape:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads}")
        return self

    def differences(self, built: dict) -> list[str]:
        """`field: built, wanted` for each field the shape a model was built with (`SHAPE_FILE`) disagrees in."""
        return [f"{name}: {built.get(name)}, wanted {value}" for name, value in self if built.get(name) != value]


def build_tiny_model(
    out_dir: str | os.PathLike,
    shape: TinyShape | None = None,
    *,
    vocab_size: int = 1024,
    initializer_range: float = 0.1,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
) -> pathlib.Path:
    """Build a tiny random-weight Qwen3 model of `shape` (default `TinyShape()`) plus tokenizer into ``out_dir``
    and return its path.

    The tokenizer is a byte-level BPE with at most ``vocab_size`` tokens, trained on random-play
    TextArena games (or on ``corpus`` when given; see :func:`build_tokenizer`); the model's vocabulary
    equals the tokenizer's. Weights are deterministic for a given ``seed``; their standard deviation
    ``initializer_range`` is 0.1 rather than Qwen3's 0.02, because at 0.02 a model this small (tied
    embeddings of norm ~0.2) cannot make sharp predictions and learns to read the board far more slowly
    (docs/learning.md, "Warm start"). The model is written to a temporary sibling directory and renamed into
    place, so ``out_dir`` is never half-built; an existing ``out_dir`` is replaced.
    """
    shape = shape or TinyShape()
    out_dir = pathlib.Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, corpus, seed)
    sizes = {HF_NAMES.get(name, name): value for name, value in shape}
    model = _build_model(tokenizer, seed, initializer_range, **sizes)
    return _save(out_dir, tokenizer, model, {SHAPE_FILE: shape.model_dump_json(indent=2)})


def ensure_tiny_model(out_dir: str | os.PathLike, shape: TinyShape | None = None, **kwargs) -> pathlib.Path:
    """Return ``out_dir``, first building it with :func:`build_tiny_model` if it has no ``config.json``. A model
    already there of another shape than `shape` (when given) is never replaced or used in its place
    (`check_tiny_shape`)."""
    out_dir = pathlib.Path(out_dir).resolve()
    if not (out_dir / "config.json").is_file():
        return build_tiny_model(out_dir, shape, **kwargs)
    if shape is not None:
        check_tiny_shape(out_dir, shape)
    return out_dir


def check_tiny_shape(model_dir: str | os.PathLike, shape: TinyShape) -> None:
    """Raise ValueError, naming each difference, when `model_dir` holds a tiny model built with another shape than
    `shape`. Any other model there (no `SHAPE_FILE`: a real model, or a tiny one built before the file) passes."""
    record = pathlib.Path(model_dir) / SHAPE_FILE
    if not record.is_file():
        return
    differences = shape.differences(json.loads(record.read_text()))
    if differences:
        raise ValueError(
            f"{model_dir} holds a tiny model of another shape than model.tiny_shape ({'; '.join(differences)}): "
            "give each shape a model.path of its own"
        )


def ensure_shaped_model(
    out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike, shape: dict[str, int] = QWEN3_06B_SHAPE
) -> pathlib.Path:
    """Return ``out_dir``, first building there (when it has no ``config.json``) a random-weight bfloat16 Qwen3 of
    ``shape`` (default Qwen3-0.6B's) with the tokenizer at ``tokenizer_dir`` (the tiny model's): a real model's
    cost per token without downloading it. Weights are seeded with 0 and drawn with Qwen3's standard deviation."""
    out_dir = pathlib.Path(out_dir).resolve()
    if (out_dir / "config.json").is_file():
        return out_dir
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return _save(out_dir, tokenizer, _build_model(tokenizer, 0, 0.02, **shape).to(torch.bfloat16))


def weight_bytes(model_dir: str | os.PathLike, dtype_bytes: int) -> int:
    """Bytes of weights one decode step of the model at ``model_dir`` reads, at ``dtype_bytes`` per weight (tied
    embeddings counted once, as the output projection); the model is built on the meta device, so nothing loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return dtype_bytes * sum(p.numel() for p in model.parameters())
