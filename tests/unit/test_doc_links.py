"""Every relative link between the documents resolves: a reader who follows one from the
README into docs/, the operator guide or the benchmarks lands on a file that exists and, where
the link names an anchor, on a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DOCUMENTS = sorted(
    [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "RELIABILITY.md"]
    + [ROOT / "hospitals" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
    + list((ROOT / "benchmarks").glob("*.md"))
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, numbered as GitHub numbers repeated ones."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            found.add(slug if count == 0 else f"{slug}-{count}")
            seen[slug] = count + 1
    return found


def links(path: Path) -> list[str]:
    """The relative links of a markdown file (web and mail addresses left out)."""
    found = []
    for line in _prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                found.append(target)
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file_and_heading(document):
    broken = []
    for target in links(document):
        name, _, anchor = target.partition("#")
        path = (document.parent / name).resolve() if name else document
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor in {path.name}")
    assert not broken, broken


def test_the_anchor_rule_is_githubs():
    cases = {
        "Secure aggregation (`--secure-aggregation`)": "secure-aggregation---secure-aggregation",
        "What a node promises, against whom": "what-a-node-promises-against-whom",
        "The site's policy (`[policy]`) and approval": "the-sites-policy-policy-and-approval",
    }
    assert {heading: _slug(heading) for heading in cases} == cases
