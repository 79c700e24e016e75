"""The live gate's pure decision (libpolicy.hostrun_live), table-driven."""

from __future__ import annotations

import pytest

from libpolicy import hostrun_live as rules
from libpolicy.hostrun import Table

RECORDED = {".git": 1, "sub/.git": 2, ".git/modules/m": 3}


@pytest.mark.parametrize(("rel", "git_dir"), [
    ("a.txt", None),
    (".git/HEAD", ".git"),
    (".git/hooks/pre-commit", ".git"),
    (".git/modules/m/config", ".git/modules/m"),  # the longest recorded one
    ("sub/.git/config", "sub/.git"),
    ("sub2/.git", None),  # a gitlink file: no directory around it
    ("sub3/.git/HEAD", "sub3/.git"),  # a .git the session made
    ("x/.git/hooks/h", "x/.git"),
    (".gitc/config", None),  # no .git on its way: the gate probes the directory
])
def test_git_dir_of(rel: str, git_dir: str | None) -> None:
    assert rules.git_dir_of(rel, RECORDED) == git_dir


@pytest.mark.parametrize(("rel", "dirs"), [
    (".gitc/config", [".gitc"]),
    (".gitc/hooks/post-index-change", [".gitc"]),
    ("x/HEAD", ["x"]),
    ("src/main.c", []),
    ("hooks", []),
])
def test_probes(rel: str, dirs: list[str]) -> None:
    assert rules.probes(rel) == dirs


T = Table()


@pytest.mark.parametrize(("rel", "git_dir", "recorded", "unchanged", "refused"), [
    # ordinary files and git's own data: never refused
    ("a.txt", None, False, False, False),
    (".git/HEAD", ".git", True, False, False),
    (".git/index", ".git", True, False, False),
    (".git/objects/ab/cdef", ".git", True, False, False),
    # host-run entries of a repository there at the start: only as recorded
    (".git/hooks/pre-commit", ".git", True, True, False),
    (".git/hooks/pre-commit", ".git", True, False, True),
    (".git/hooks/post-index-change", ".git", True, False, True),  # new
    (".git/commondir", ".git", True, False, True),  # new
    (".git/config", ".git", True, False, True),
    (".git/modules/m/config", ".git/modules/m", True, False, True),
    # a gitlink: as recorded, or refused
    ("sub/.git", None, False, True, False),
    ("sub2/.git", None, False, False, True),
    # anything in a git directory the session made, HEAD included
    ("sub3/.git/HEAD", "sub3/.git", False, False, True),
    (".gitc/config", ".gitc", False, False, True),
    (".gitc/hooks/h", ".gitc", False, False, True),
    # tree entries of the table
    (".vscode/settings.json", None, False, True, False),
    (".vscode/settings.json", None, False, False, True),
    (".envrc", None, False, False, True),
])
def test_verdict(rel: str, git_dir: str | None, recorded: bool, unchanged: bool,
                 refused: bool) -> None:
    why = rules.verdict(rel, T, git_dir=git_dir, recorded=recorded, unchanged=unchanged)
    assert (why is not None) is refused, why
