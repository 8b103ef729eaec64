"""Locally built models: a tiny random-weight Qwen3 with a game-trained tokenizer, for offline runs and tests, and
a random model of Qwen3-0.6B's shape on that tokenizer, for measuring speed at a real model's size."""

from unstable.models.tiny import (
    QWEN3_06B_SHAPE,
    TinyShape,
    build_tiny_model,
    build_tokenizer,
    ensure_shaped_model,
    ensure_tiny_model,
    game_corpus,
    weight_bytes,
)

__all__ = [
    "QWEN3_06B_SHAPE",
    "TinyShape",
    "build_tiny_model",
    "build_tokenizer",
    "ensure_shaped_model",
    "ensure_tiny_model",
    "game_corpus",
    "weight_bytes",
]
