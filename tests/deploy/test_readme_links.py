"""The README and the docs link only to files in the repository, and every such link resolves:
a reader of a fresh clone (or of the repository's web page) never meets a dead link or a
file that lives somewhere else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("services/*/README.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_resolve(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if target.startswith("#"):
            continue  # an anchor in the same page
        assert not re.match(r"[a-z]+:", target), f"{doc.name} links outside the repository: {target}"
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links to {target}, outside the repository"
        assert path.exists(), f"{doc.name} links to {target}, which does not exist"
