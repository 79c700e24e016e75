"""Every tree entry of libpolicy.hostrun's table, through the real scan and sweep (table-driven:
an entry added to the table is tested here without a line more)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hostrun_sweep import snapshot_and_sweep, world  # noqa: F401 (world: a fixture)

from libpolicy.hostrun import DEFAULT, Entry


def _example(pattern: str) -> str:
    """A path that is the tree entry ``pattern`` (a directory: a file in it), two levels down."""
    parts = [("x" + p[1:]) if p.startswith("*") else p for p in pattern.rstrip("/").split("/")]
    return "/".join(["a", "b", *parts] + (["f.json"] if pattern.endswith("/") else []))


TREE_ENTRIES = [e for e in DEFAULT.tree if e.rule != "git-dir"]


@pytest.mark.parametrize("entry", TREE_ENTRIES, ids=[e.rule for e in TREE_ENTRIES])
def test_every_tree_entry_that_appears_is_moved_aside(world: tuple[Path, Path, Path],  # noqa: F811
                                                      tmp_path: Path, entry: Entry) -> None:
    """The walk finds every tree entry of the table (a globbed one by its suffix) at depth."""
    work, state, _ = world
    rel = _example(entry.pattern)

    def attack() -> None:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("{\"planted\": 1}\n")

    lines = snapshot_and_sweep(work, state, attack, tmp_path)
    top = rel if not entry.is_dir else rel.rsplit("/", 1)[0]
    assert any(line.startswith(f"agent-sandbox: {top} [{entry.rule}]") for line in lines), lines
    assert not (work / rel).exists()


@pytest.mark.parametrize("entry", TREE_ENTRIES, ids=[e.rule for e in TREE_ENTRIES])
def test_every_tree_entry_that_changed_is_put_back(world: tuple[Path, Path, Path],  # noqa: F811
                                                   tmp_path: Path, entry: Entry) -> None:
    work, state, _ = world
    rel = _example(entry.pattern)
    (work / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / rel).write_text("the person's\n")
    lines = snapshot_and_sweep(work, state, lambda: (work / rel).write_text("planted\n"),
                               tmp_path)
    assert lines and (work / rel).read_text() == "the person's\n"
