"""The results the guide cites are data: `benchmarks/results/manifest.yaml` names each (what made it and its files),
the guide's result tables are written from them (`benchmarks/tables.py`), and nothing else is tracked."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tables  # noqa: E402

MAX_TRACKED_BYTES = 5_000_000


def tracked_results() -> list[str]:
    """Every tracked file under the result folders but the manifest itself."""
    listed = subprocess.run(["git", "ls-files", *tables.RESULT_FOLDERS], cwd=ROOT, capture_output=True, text=True)
    return [name for name in listed.stdout.split() if ROOT / name != tables.MANIFEST]


def _covers(entry: dict, name: str) -> bool:
    return any(name == path or name.startswith(path.rstrip("/") + "/") for path in entry["files"])


def _holds(entry: dict, source: str) -> bool:
    """Whether a table's source is one of the entry's files or a folder holding all of them."""
    return _covers(entry, source) or (source.endswith("/") and all(path.startswith(source) for path in entry["files"]))


def test_every_result_table_in_the_guide_is_current():
    assert tables.stale_pages() == [], "python benchmarks/tables.py rewrites the stale tables"


def test_a_result_that_changes_without_its_table_is_stale(monkeypatch):
    shown = sorted({block.group(2) for page in tables.PAGES for block in tables.BLOCK.finditer(page.read_text())})
    source = next(s for s in (tables.manifest()[name]["source"] for name in shown) if not s.endswith("/"))
    changed, load = _with_every_number_changed(tables._load(source)), tables._load
    monkeypatch.setattr(tables, "_load", lambda path: changed if path == source else load(path))
    assert tables.stale_pages(), f"changing {source} left every page current"


def _with_every_number_changed(data):
    if isinstance(data, dict):
        return {key: _with_every_number_changed(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_with_every_number_changed(value) for value in data]
    return data + 1 if isinstance(data, int | float) and not isinstance(data, bool) else data


def test_every_tracked_result_is_in_the_manifest_and_every_entry_exists():
    entries = tables.manifest()
    orphans = [name for name in tracked_results() if not any(_covers(entry, name) for entry in entries.values())]
    assert not orphans, f"results no manifest entry names (cite them or remove them): {orphans}"
    missing = [path for entry in entries.values() for path in entry["files"] if not (ROOT / path).exists()]
    missing += [
        entry["source"] for entry in entries.values() if "source" in entry and not _holds(entry, entry["source"])
    ]
    assert not missing, f"manifest paths that are not files of their entry: {missing}"


def test_every_manifest_entry_is_cited_by_a_page():
    pages = "\n".join(page.read_text() for page in tables.PAGES)
    uncited = [
        name
        for name, entry in tables.manifest().items()
        if f"<!-- result: {name} -->" not in pages and not any(path.rstrip("/") in pages for path in entry["files"])
    ]
    assert not uncited, f"manifest entries no page cites (remove their results): {uncited}"


def test_tracked_results_stay_small():
    size = sum((ROOT / name).stat().st_size for name in tracked_results())
    assert size < MAX_TRACKED_BYTES, f"tracked results hold {size:,} bytes; the limit is {MAX_TRACKED_BYTES:,}"


def test_a_result_records_paths_inside_the_repository_relative_to_it():
    import argparse

    from recorded import settings

    args = argparse.Namespace(out=ROOT / "benchmarks" / "results" / "x.json", runs=str(ROOT / "runs"), tmp="/tmp/r")
    args.recipes, args.steps = [ROOT / "examples" / "tictactoe-tiny.yaml"], 3
    assert settings(args) == {
        "out": "benchmarks/results/x.json",
        "runs": "runs",
        "tmp": "/tmp/r",
        "recipes": ["examples/tictactoe-tiny.yaml"],
        "steps": 3,
    }
