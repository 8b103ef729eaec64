"""Prompt templates: how an observation becomes the text a model sees, and how a move is written back.

`qwen3-zs` is the original API's zero-shot game prompt in Qwen's chat format; `default` uses the tokenizer's own chat
template; `plain` is the raw observation. `format_action` is the completion a template expects for a move,
used to build supervised (SFT) targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_QWEN3_ZS = (
    "<|im_start|>user\nYou are playing a two-player zero-sum game. Make valid actions to win.\n"
    "Observation: {observation}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    "<|im_end|>\n<|im_start|>assistant\n"
)


@dataclass(frozen=True)
class PromptTemplate:
    """A named way to render observations into prompts and moves into completions."""

    name: str
    render_fn: Callable[[str, Any], str]
    format_action: Callable[[str], str]

    def render(self, observation: str, tokenizer: Any = None) -> str:
        """The prompt text for `observation` (some templates need the tokenizer's chat template)."""
        return self.render_fn(observation, tokenizer)


def _render_chat(observation: str, tokenizer: Any) -> str:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt template 'default' needs a tokenizer with a chat_template")
    messages = [{"role": "user", "content": observation}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _boxed(action: str) -> str:
    return f"\\boxed{{{action}}}"


TEMPLATES: dict[str, PromptTemplate] = {
    "qwen3-zs": PromptTemplate("qwen3-zs", lambda obs, _: _QWEN3_ZS.format(observation=obs), _boxed),
    "default": PromptTemplate("default", _render_chat, _boxed),
    "plain": PromptTemplate("plain", lambda obs, _: f"{obs}\nYour move: ", lambda action: action),
}


def get_template(name: str) -> PromptTemplate:
    """Look a template up by name; unknown names raise with the list of valid ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown prompt template {name!r}; valid: {sorted(TEMPLATES)}") from None
