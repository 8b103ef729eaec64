"""The guide's result tables, written from the results they cite.

`benchmarks/results/manifest.yaml` names every tracked result: what made it (recipe, command, commit, machine) and
its files. An entry with a `table` is shown in the guide: a page holds it between `<!-- result: NAME -->` and
`<!-- end result -->`, and this script writes that block from the entry's file, so a table cannot drift from its
data. `tests/test_results.py` fails when a block differs from what this script writes (a result changed without
its table) and when a tracked result file is in no entry (results nothing cites leave the tree).

    python benchmarks/tables.py            # rewrite every block in README.md, docs/ and experiments/log.md
    python benchmarks/tables.py --check    # exit 1 naming each stale block

An entry's `table` is a list of rows, the first the header. A cell is text, in which `{a.b.0.c:.3f}` is replaced by
the value at that path of the entry's `source` (a JSON file among its files; keys and list indices, dot-separated)
in that format; where `source` is a folder, `{seed-60/learning.json#a.b:.3f}` names the file in it. The line under
a table names the entry's commands, machine and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "benchmarks" / "results" / "manifest.yaml"
RESULT_FOLDERS = ("benchmarks/results", "experiments/results")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "log.md"]
BLOCK = re.compile(r"(<!-- result: ([\w-]+) -->\n)(.*?)(<!-- end result -->)", flags=re.S)
FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
REQUIRED = ("what", "command", "commit", "machine", "files")


def manifest() -> dict[str, dict[str, Any]]:
    """The manifest's entries by name, each checked to name what made it."""
    entries = yaml.safe_load(MANIFEST.read_text())
    for name, entry in entries.items():
        missing = [key for key in REQUIRED + (("source",) if "table" in entry else ()) if not entry.get(key)]
        if missing:
            raise ValueError(f"{MANIFEST.relative_to(ROOT)}: entry {name!r} lacks {', '.join(missing)}")
    return entries


@cache
def _load(path: str) -> Any:
    return json.loads((ROOT / path).read_text())


def value_at(data: Any, path: str) -> Any:
    """The value at a dot-separated path of keys and list indices."""
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def cell(text: str, source: str) -> str:
    """A table cell with each `{path:format}` replaced by the value in `source` (a JSON file of the repository), or
    each `{file#path:format}` by the value in that file of the folder `source`."""

    def value(match: re.Match) -> str:
        file, _, path = match.group(1).rpartition("#")
        data = _load(f"{source.rstrip('/')}/{file}" if file else source)
        return format(value_at(data, path), match.group(2) or "")

    return FIELD.sub(value, str(text))


def render(name: str, entry: dict[str, Any], page: Path) -> str:
    """An entry's block body: its table, then the line that says what made it, with a link to its data."""
    source = entry["source"]
    header, *rows = [[cell(text, source) for text in row] for row in entry["table"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    link = os.path.relpath(ROOT / source, page.parent)
    commands = [f"`{command.strip()}`" for command in entry["command"].split(";")]
    made_by = ", ".join(commands[:-1]) + " and " + commands[-1] if len(commands) > 1 else commands[0]
    note = f" ({entry['commit_note']})" if entry.get("commit_note") else ""
    lines += ["", f"Made by {made_by} on {entry['machine']} at commit {entry['commit']}{note} ([data]({link}))."]
    return "\n".join(lines) + "\n"


def refreshed(page: Path, entries: dict[str, dict[str, Any]]) -> str:
    """The page with each result block written from its entry."""

    def body(match: re.Match) -> str:
        name = match.group(2)
        if name not in entries or "table" not in entries[name]:
            raise ValueError(f"{page.relative_to(ROOT)}: no manifest entry {name!r} with a table")
        return match.group(1) + render(name, entries[name], page) + match.group(4)

    return BLOCK.sub(body, page.read_text())


def stale_pages() -> list[str]:
    """The pages whose result blocks differ from what their files say."""
    entries = manifest()
    return [str(page.relative_to(ROOT)) for page in PAGES if refreshed(page, entries) != page.read_text()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report the pages whose tables are stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_pages()
        for page in stale:
            print(f"{page}: a result table is stale (python benchmarks/tables.py rewrites it)")
        return 1 if stale else 0
    entries = manifest()
    for page in PAGES:
        page.write_text(refreshed(page, entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
