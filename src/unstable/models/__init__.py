"""Locally built models: a tiny random-weight Qwen3 with a game-trained tokenizer, for offline runs and tests."""

from unstable.models.tiny import build_tiny_model, build_tokenizer, ensure_tiny_model, game_corpus

__all__ = ["build_tiny_model", "build_tokenizer", "ensure_tiny_model", "game_corpus"]
