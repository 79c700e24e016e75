"""The end sweep's walk with the live guard's quiet directories (Watcher.quiet_dirs).

A directory no event named since go has the names it had at the start, so the
walk takes what the start found there without an ``lstat``, but only where every
directory above it is proven the same way (or was found unchanged).  These tests
hold that shortcut to the full walk: the same repositories, gitlinks, new entries
and unreadable directories, for trees changed the ways that could fool it (a
quiet directory whose parent was moved away and made again, a new repository
below a quiet one), and the watcher's own answer through real inotify events.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from libbroker.launcher import hostrun_live, hostrun_scan
from libbroker.launcher.hostrun_walk import Walk
from libpolicy.hostrun import Table


def _git_init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, capture_output=True)


def _tree(work: Path) -> None:
    for d in ("a/b/c", "a/b/d", "e/f", "g"):
        (work / d).mkdir(parents=True)
        (work / d / "x.txt").write_text("x\n")
    _git_init(work / "e/f/repo")
    (work / "a/b/c/.envrc").write_text("export A=1\n")


def _findings(walk: Walk) -> dict[str, Any]:
    return {"git_dirs": sorted(walk.git_dirs), "gitlinks": sorted(walk.gitlinks),
            "found": sorted((rel, e.rule) for rel, e in walk.found),
            "unreadable": sorted(walk.unreadable)}


def _both(work: Path, base: dict[str, list[Any]], quiet: frozenset[str]
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The findings of the full walk and of the quiet one, over the same tree."""
    root = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        full, fast = Walk(Table(), base), Walk(Table(), base, quiet=quiet)
        full.run(root)
        fast.run(root)
    finally:
        os.close(root)
    return _findings(full), _findings(fast)


def _moved_parent(work: Path) -> set[str]:
    """``mv a a2 && mkdir -p a/b`` and a repository in the new a/b: the old a/b's inode
    (now a2/b) had no event of its own, so a watcher calls "a/b" quiet."""
    os.rename(work / "a", work / "a2")
    _git_init(work / "a/b/planted")
    return {"", "a"}


def _deep_new_repo(work: Path) -> set[str]:
    _git_init(work / "a/b/d/nr")
    return {"a/b/d"}


def _gitlink(work: Path) -> set[str]:
    (work / "g/.git").write_text("gitdir: ../e/f/repo/.git\n")
    return {"g"}


def _unreadable(work: Path) -> set[str]:
    (work / "e/locked").mkdir()
    (work / "e/locked").chmod(0)
    return {"e"}


def _replaced_dir(work: Path) -> set[str]:
    shutil.rmtree(work / "a/b/c")
    (work / "a/b/c").mkdir()
    (work / "a/b/c/.vscode").mkdir()
    (work / "a/b/c/.vscode/tasks.json").write_text("{}\n")
    return {"a/b", "a/b/c"}


@pytest.mark.parametrize("change", [_moved_parent, _deep_new_repo, _gitlink, _unreadable,
                                    _replaced_dir])
def test_the_quiet_walk_finds_what_the_full_walk_finds(tmp_path: Path,
                                                       change: Callable[[Path], set[str]]
                                                       ) -> None:
    work = tmp_path / "work"
    _tree(work)
    snap = hostrun_scan.scan(str(work), Table())
    touched = change(work)
    # Quiet: every directory of the start an event did not name directly (the most a
    # watcher could claim); the directories inside git dirs are not watched.
    quiet = frozenset(rel for rel in snap.dirs if rel not in touched and "/.git" not in
                      f"/{rel}" and not rel.startswith(".git"))
    full, fast = _both(work, snap.dirs, quiet)
    assert fast == full
    if change is _moved_parent:
        assert "a/b/planted/.git" in [r for r, _ in fast["git_dirs"]]
    if (work / "e/locked").exists():
        (work / "e/locked").chmod(0o700)


def test_nothing_changed_takes_every_directory_without_a_look(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _tree(work)
    snap = hostrun_scan.scan(str(work), Table())
    full, fast = _both(work, snap.dirs, frozenset(snap.dirs))
    assert fast == full and [r for r, _ in full["git_dirs"]] == ["e/f/repo/.git"]


def _watched(tmp_path: Path, act: Callable[[Path], None], lost: bool = False
             ) -> frozenset[str] | None:
    """A real watcher over the tree while ``act`` changes it; its quiet directories at the
    end (``lost``: as after a Q_OVERFLOW event)."""
    work = tmp_path / "work"
    _tree(work)
    snap = hostrun_scan.scan(str(work), Table())
    watcher = hostrun_live.begin(snap, str(tmp_path / "state"), "", swap=False)
    watcher.start()
    watcher.wait_ready()
    try:
        act(work)
        watcher.overflows += lost
    finally:
        hostrun_live.end(watcher, snap)
    return watcher.quiet_dirs()


def test_the_watcher_calls_quiet_only_what_no_event_named(tmp_path: Path) -> None:
    def act(work: Path) -> None:
        (work / "a/b/c/new.txt").write_text("n\n")  # a name added
        with open(work / "e/f/x.txt", "a") as f:  # a file written in place
            f.write("more\n")
        (work / "g").chmod(0o700)  # the directory itself

    quiet = _watched(tmp_path, act)
    assert quiet is not None
    # (a child's change is named on its parent's watch too: "" for g's chmod)
    assert not {"a/b/c", "e/f", "g", ""} & quiet
    assert {"a", "a/b", "a/b/d", "e", "e/f/repo", "e/f/repo/.git/hooks"} <= quiet
    # what git writes all the time is not watched, so never quiet
    assert not [rel for rel in quiet if "/.git/objects" in rel or "/.git/refs" in rel]


def test_a_lost_event_leaves_no_quiet_directory(tmp_path: Path) -> None:
    assert _watched(tmp_path, lambda work: (work / "g/y").write_text("y\n"), lost=True) is None


def test_a_link_to_the_moved_original_is_not_taken_for_it(tmp_path: Path) -> None:
    """The repository moved aside and a link put in its place leads to the very inodes the
    scan recorded: by path every entry looks unchanged.  The directory above changed
    (its ctime), so nothing below it takes the shortcut: the link is moved aside."""
    from libbroker.launcher import hostrun_sweep
    from libbroker.launcher.hostrun_same import SameByPath

    work = tmp_path / "work"
    _tree(work)
    snap = hostrun_scan.scan(str(work), Table())
    os.rename(work / "e/f/repo", work / "e/f/moved")
    os.symlink("moved", work / "e/f/repo")
    # what a watcher calls quiet: all but e/f (its names changed) and the moved
    # directory's own watch (MOVE_SELF); the directories inside it had no event
    quiet = frozenset(rel for rel in snap.dirs if rel not in ("e/f", "e/f/repo"))
    root = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fast = SameByPath(root, snap.dirs, quiet)
        for rel, (_, node) in snap.entries.items():
            if rel.startswith("e/f/repo/"):
                assert not fast.unchanged(rel, node), rel
        assert fast.unchanged("a/b/c/.envrc", snap.entries["a/b/c/.envrc"][1])
    finally:
        os.close(root)
    lines = hostrun_sweep.sweep(snap, str(tmp_path / "state"), quiet=quiet)
    assert not (work / "e/f/repo").is_symlink() and (work / "e/f/repo/.git").is_dir()
    assert any("e/f/repo" in line for line in lines), lines
