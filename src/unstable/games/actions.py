"""Turn a model's free text into the move string TextArena expects."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,80}\]")


def extract_action(text: str) -> tuple[str, bool]:
    """Return `(action, format_ok)` from a completion.

    The last `\\boxed{...}` wins; inside or outside it, a `[move]` form is kept as is and a bare answer is
    wrapped in brackets (`\\boxed{4}` -> `[4]`). Without either form the stripped text is passed through so
    the env judges it (usually an invalid move), and `format_ok` is False.
    """
    boxed = _BOXED.findall(text)
    if boxed:
        inner = boxed[-1].strip()
        bracketed = _BRACKETED.findall(inner)
        if bracketed:
            return bracketed[-1], True
        return (f"[{inner}]", True) if inner else (text.strip(), False)
    bracketed = _BRACKETED.findall(text)
    if bracketed:
        return bracketed[-1], True
    return text.strip(), False
