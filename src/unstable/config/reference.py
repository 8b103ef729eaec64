"""The configuration reference: one Markdown table per section of `RunConfig`, read off the settings models.

`docs/configuration.md` is this module's output (`python -m unstable.config.reference > docs/configuration.md`;
`tests/test_config_doc.py` fails when it is stale), so the reference never disagrees with what validation accepts.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from unstable.config.schema import RunConfig

HEADER = """# Configuration reference

This page lists every setting a run config (`unstable train CONFIG.yaml`, `--set section.field=value`) accepts,
one table per section, with its type, default and meaning.

Generated from the settings models by `python -m unstable.config.reference > docs/configuration.md`
(`tests/test_config_doc.py` fails when this page is stale; `UPDATE_CONFIG_DOC=1` rewrites it). Each component
declares its own section (`pool/config.py`, `learner/config.py`, ...); `config/schema.py` nests them. An unknown
key is an error naming it; `examples/tictactoe-tiny.yaml` is a complete, commented config.
"""

BOUNDS = ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<"))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models an annotation holds: itself, or those inside `X | None`, `list[X]`, ..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def type_name(annotation: Any) -> str:
    """A short, readable name for a field's type: `int | None`, `list[str]`, `'a' | 'b'`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    """The numeric bounds validation enforces, e.g. ' (>= 1, <= 64)'."""
    found = [
        f"{sign} {getattr(item, kind.__name__.lower())}"
        for item in field.metadata
        for kind, sign in BOUNDS
        if isinstance(item, kind)
    ]
    return f" ({', '.join(found)})" if found else ""


def default_text(field: FieldInfo) -> str:
    """The field's default as a config would write it; 'required' when it has none."""
    if field.is_required():
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its section's defaults"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [item.model_dump(exclude_defaults=True) for item in value]
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _row(name: str, field: FieldInfo, path: str, where: dict[type[BaseModel], str]) -> str:
    """One field's row; a nested section is named where its own table is."""
    kind = f"`{_cell(type_name(field.annotation))}`{_bounds(field)}"
    description = field.description or ""
    for nested in _models_in(field.annotation):
        description = f"{description}; " if description else ""
        description += f"see `{where.get(nested, path + name)}`"
    return f"| `{name}` | {kind} | {_cell(default_text(field))} | {_cell(description)} |"


def _sections(model: type[BaseModel], path: str, where: dict[type[BaseModel], str]) -> list[str]:
    """The table of `model` under `path`, then the tables of the models nested in it, each model once (`where`
    maps each model to the section that has its table)."""
    where[model] = path
    summary = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())  # the first paragraph, whole
    lines = [
        f"## `{path}`" if path else "## Top level",
        "",
        summary,
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    prefix = f"{path}." if path else ""
    rows = [(name, field) for name, field in model.model_fields.items()]
    nested = {}
    for name, field in rows:
        for sub in _models_in(field.annotation):
            if sub not in where and sub not in nested:
                nested[sub] = f"{prefix}{name}"
    where.update(nested)
    lines += [_row(name, field, prefix, where) for name, field in rows]
    lines.append("")
    for sub, at in nested.items():
        lines += _sections(sub, at, where)
    return lines


def reference() -> str:
    """The whole of `docs/configuration.md`."""
    return HEADER + "\n" + "\n".join(_sections(RunConfig, "", {}))


if __name__ == "__main__":
    print(reference(), end="")
