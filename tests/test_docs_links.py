"""The docs hold together: every page of docs/ is in its index, and every relative
link in the README and docs/ names a file of the repository (nothing points outside)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# [text](target): the target up to a space, ')' or '#'.
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_every_docs_page_is_in_the_index() -> None:
    index = (DOCS / "README.md").read_text()
    missing = [p.name for p in DOCS.glob("*.md")
               if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"add to docs/README.md: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_in_the_repository(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} points outside"
        assert resolved.exists(), f"{page.name}: {target} does not exist"
    text = page.read_text()
    assert "../shared" not in text and "/work/" not in text, f"{page.name} cites a path outside"
