"""Every relative link in the README, the guide (`docs/`) and the experiment log resolves: to a file or folder of
the repository, and, with a `#fragment`, to a heading of that Markdown file (GitHub's anchor for it)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> str:
    """The text without fenced code blocks, whose '#' lines are not headings."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _outside_code(text: str) -> str:
    """The text without code, fenced or inline, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", _outside_fences(text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of a Markdown page."""
    headings = re.findall(r"^#+ (.+)$", _outside_fences(page.read_text()), flags=re.M)
    return {anchor(heading) for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_outside_code(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


CODE = [
    p
    for folder in ("src", "benchmarks", "experiments", "examples", "tests")
    for p in sorted((ROOT / folder).rglob("*.py"))
]
CODE += sorted((ROOT / "examples").glob("*.yaml"))
POINTER = re.compile(r"((?:docs|experiments)/[\w/-]+\.md)(?:#([\w-]+)|, \"([^\"]+)\")?")


def headings(page: Path) -> list[str]:
    """The text of every heading of a Markdown page."""
    return [h.strip() for h in re.findall(r"^#+ (.+)$", _outside_fences(page.read_text()), flags=re.M)]


def test_code_points_at_pages_and_sections_that_exist():
    """A comment or docstring that sends the reader to a page (`docs/learning.md`) or a section of it
    (`docs/learning.md#warm-start-unstable-sft`, or `docs/learning.md, "Warm start"`: a heading's beginning)
    finds it."""
    broken = []
    for path in CODE:
        if path == Path(__file__).resolve():
            continue
        for page, fragment, title in POINTER.findall(path.read_text()):
            target, title = ROOT / page, " ".join(title.split())  # a title may wrap onto the next comment line
            if not target.exists():
                broken.append(f"{path.relative_to(ROOT)}: {page}: no such page")
            elif fragment and fragment not in anchors(target):
                broken.append(f"{path.relative_to(ROOT)}: {page}#{fragment}: no heading with that anchor")
            elif title and not any(h.strip("`").startswith(title) for h in headings(target)):
                broken.append(f"{path.relative_to(ROOT)}: {page}, {title!r}: no heading begins so")
    assert not broken, "\n".join(broken)


def test_no_file_holds_a_merge_conflict_marker():
    """A merge left unresolved (`<<<<<<<` ... `>>>>>>>`) in any tracked text file fails here, not in a reader's eyes."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    marker = re.compile(r"^(<{7} |>{7} )", flags=re.M)
    texts = [ROOT / name for name in tracked if name.endswith((".md", ".py", ".yaml", ".toml", ".sh", ".cfg", ".txt"))]
    marked = [str(path.relative_to(ROOT)) for path in texts if path.is_file() and marker.search(path.read_text())]
    assert not marked, f"merge conflict markers in {marked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_cites_a_file_outside_the_repository(page):
    """A reader has the repository only: a page that names a path outside it (our `shared/` notes, `../` past the
    root) cites something they cannot open."""
    text = page.read_text()
    outside = re.findall(r"(?<![\w.])(?:\.\./)*shared/[\w./-]+", text)
    outside += [t for t in LINK.findall(_outside_code(text)) if not re.match(r"[a-z]+:", t) and not _inside(page, t)]
    assert not outside, f"{page.relative_to(ROOT)} cites outside the repository: {outside}"


def _inside(page: Path, target: str) -> bool:
    """Whether the relative link `target` of `page` stays inside the repository."""
    return (page.parent / target.partition("#")[0]).resolve().is_relative_to(ROOT)
