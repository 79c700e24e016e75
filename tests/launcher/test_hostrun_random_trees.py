"""Random trees a session could plant; after the sweep the host's git runs nothing from anywhere.

A property test at the unit level (no session): the guard scans a workdir
holding a repository with a submodule and a nested repository, then a drawn
list of steps plants what a session could: git directories at any depth
(inside ``.git/modules/``, inside another git dir, under odd names),
``gitdir:`` files and ``commondir`` pointing at them (some through a link
into ``.git/objects``), links to anywhere, odd modes, and commands in the
existing repositories' hooks and config.  Every planted git dir carries a
hook, a ``core.fsmonitor`` and two aliases that write a canary outside the
workdir.  The sweep runs (as an ordinary user when one can be made, so that
a mode it cannot read must end in "moved aside"), then the host's real git
runs ``status``, ``commit`` and the aliases from every directory of the
workdir, as root (it can read what the user's sweep could not): no canary
may appear.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from hostrun_attack_cells import OrdinaryUser, the_user  # type: ignore[attr-defined]
from hostrun_attack_plants import commits, git, remove_tree
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from libbroker.launcher import hostrun_guard as guard
from libpolicy.hostrun import Table

# Bounded so that the test takes seconds (no shrinking either: a failure prints its
# steps); HOSTRUN_RANDOM_EXAMPLES=200 for a longer search.
EXAMPLES = int(os.environ.get("HOSTRUN_RANDOM_EXAMPLES", "8"))
NAMES = ["a", "b c", "-x", "n\nl", "\udcff\udcfe", ".git", "modules", "hooks", "objects", "g"]
MODES = [0o000, 0o311, 0o111, 0o555, 0o700]
ANCHORS = ["", ".git/modules", ".git/modules/m", ".git/.git/modules", "sub/.git/modules",
           ".git/worktrees", ".git/objects", "sub", "m"]

_name = st.sampled_from(NAMES)
_path = st.tuples(st.sampled_from(ANCHORS), st.lists(_name, min_size=1, max_size=3))
STEP = st.one_of(
    st.tuples(st.just("gitdir"), _path),
    st.tuples(st.just("gitlink"), _path, st.integers(0, 7), st.booleans()),
    st.tuples(st.just("commondir"), st.sampled_from([".git", "sub/.git", ".git/modules/m"]),
              st.integers(0, 7)),
    st.tuples(st.just("link"), _path, st.sampled_from([".git", ".git/hooks", ".git/objects",
                                                       "sub/.git", "/", "OUT"])),
    st.tuples(st.just("chmod"), st.sampled_from([".git", ".git/hooks", "sub/.git", "sub",
                                                 ".git/modules", "m"]), st.sampled_from(MODES)),
    st.tuples(st.just("own"), st.sampled_from([".git", "sub/.git", ".git/modules/m"])),
)


def _known(work: Path) -> frozenset[str]:
    return frozenset(os.path.relpath(root, work) for root, _, _ in os.walk(work))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with a submodule ``m`` and a nested repository ``sub``, made once."""
    top = tmp_path_factory.mktemp("random-trees")
    commits(top / "lib", 1)
    work = top / "work"
    commits(work, 1)
    git(work, "submodule", "add", "-q", str(top / "lib"), "m")
    git(work, "commit", "-q", "-m", "module")
    commits(work / "sub", 1)
    git(top, "init", "-q", "--bare", "bare.git")
    return top


def _arm(gitdir: Path, canary: Path, tag: str) -> None:
    """Hook, fsmonitor and aliases in ``gitdir``, each writing ``canary/tag-*``."""
    (gitdir / "hooks").mkdir(exist_ok=True)
    hook = gitdir / "hooks/pre-commit"
    hook.write_text(f"#!/bin/sh\necho ran > {canary}/{tag}-hook\n")
    hook.chmod(0o755)
    with open(gitdir / "config", "a") as f:
        f.write(f'[core]\n\tbare = false\n\tfsmonitor = "echo ran > {canary}/{tag}-fsm; false"\n'
                f'[alias]\n\tst = "-c core.fsmonitor=\'echo ran > {canary}/{tag}-alias; false\' '
                f'status"\n\tci = "!echo ran > {canary}/{tag}-bang"\n')


def _plant(work: Path, steps: list[tuple[object, ...]], bare: Path, canary: Path,
           out: Path) -> None:
    made: list[Path] = []
    for n, step in enumerate(steps):
        try:
            _step(work, step, n, made, bare, canary, out)
        except OSError:
            continue  # a step the tree makes impossible (a name taken, a mode): skip it


def _where(work: Path, path: object) -> Path:
    anchor, parts = cast("tuple[str, list[str]]", path)
    return work.joinpath(anchor, *parts)


def _step(work: Path, step: tuple[object, ...], n: int, made: list[Path], bare: Path,
          canary: Path, out: Path) -> None:
    kind = step[0]
    if kind == "gitdir":
        where = _where(work, step[1])
        where.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(bare, where)
        _arm(where, canary, f"g{n}")
        made.append(where)
    elif kind == "gitlink" and made:
        at = _where(work, step[1])
        target = made[int(step[2]) % len(made)]  # type: ignore[call-overload]
        at.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(target, at)
        if step[3] and (work / ".git/objects").is_dir():  # through a link into .git/objects
            os.symlink(".git/objects", work / f"lnk{n}")
            rel = os.path.relpath(work / f"lnk{n}", at) + "/../" + os.path.relpath(
                target, work / ".git")
        (at / ".git").write_text(f"gitdir: {rel}\n")
    elif kind == "commondir" and made:
        repo = work / str(step[1])
        target = made[int(step[2]) % len(made)]  # type: ignore[call-overload]
        (repo / "commondir").write_text(os.path.relpath(target, repo) + "\n")
    elif kind == "link":
        at = _where(work, step[1])
        at.parent.mkdir(parents=True, exist_ok=True)
        to = str(step[2])
        os.symlink(str(out) if to == "OUT" else to if to == "/" else work / to, at)
    elif kind == "chmod":
        os.chmod(work / str(step[1]), int(step[2]))  # type: ignore[call-overload]
    elif kind == "own":
        _arm(work / str(step[1]), canary, f"own{n}")


def _dirs(work: Path, known: frozenset[str]) -> list[Path]:
    """Every directory of the workdir (links not followed) but the template's own inside
    its git dirs (objects/, refs/...: git finds the same repository there as from the
    git dir, which is kept); everything the steps made is in."""
    found: list[Path] = []
    todo = [work]
    while todo:
        here = todo.pop()
        rel = os.path.relpath(here, work)
        if rel not in known or rel in KEEP:
            found.append(here)
        try:
            todo += [Path(e.path) for e in os.scandir(here) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    return found


KEEP = frozenset({".", "sub", "m", ".git", "sub/.git", ".git/modules/m", ".git/hooks"})


def _host_git(work: Path, known: frozenset[str]) -> None:
    """commit (hooks, and fsmonitor as it refreshes the index) and both aliases, everywhere."""
    for d in _dirs(work, known):
        for argv in (("commit", "-q", "--allow-empty", "-m", "h"), ("st",), ("ci",)):
            git(d, "-c", "safe.directory=*", *argv, check=False)


def _sweep(rt: str, state: str) -> None:
    snap = guard.load(rt)
    assert snap is not None
    guard.sweep(snap, state)


def _as(user: OrdinaryUser | None, fn: Callable[[], object]) -> int:
    """``fn()`` as ``user`` (a forked child) or in this process; 0 when it returned."""
    def call() -> int:
        try:
            fn()
        except BaseException:
            traceback.print_exc()
            return 1
        return 0
    return user.call(call) if user is not None else call()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=5))
def test_random_plants_never_run_after_the_sweep(template: Path,
                                                 steps: list[tuple[object, ...]]) -> None:
    base = Path(tempfile.mkdtemp(prefix="as-hra-rt-", dir="/tmp"))  # the user can reach it
    base.chmod(0o711)
    try:
        work, canary, out, rt = base / "work", base / "canary", base / "out", base / "rt"
        shutil.copytree(template / "work", work, symlinks=True)
        for d in (canary, out, rt):
            d.mkdir()
        canary.chmod(0o777)
        _arm(out, canary, "out")
        user = the_user() if os.geteuid() == 0 and not the_user().unavailable else None
        state = base / "state"
        state.mkdir()
        if user is not None:
            user.own(work, rt, state)
        assert _as(user, lambda: guard.scan(str(work), Table(), runtime_dir=str(rt))) == 0
        _plant(work, steps, template / "bare.git", canary, out)
        if user is not None:
            user.own(work)
        assert _as(user, lambda: _sweep(str(rt), str(state))) == 0, steps
        _host_git(work, _known(template / "work"))
        assert sorted(p.name for p in canary.iterdir()) == [], steps
    finally:
        remove_tree(base)
