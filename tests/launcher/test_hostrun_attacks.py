"""The attacks of issue 24 against the guard's scan and sweep, without a session (fast).

Each plants what a session could leave in its workdir between the scan and
the sweep; afterwards the host's real git, run from every directory of the
workdir (status, commit, ``rebase --continue``, the planted alias), must run
nothing (a canary outside the workdir), and the user's originals must be
there byte for byte.  test_hostrun_attack_sessions.py runs them through real
sessions on both backends, as root and as an ordinary user.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_hostrun_sweep import git, plant_bare, plant_hook

from libbroker.launcher import hostrun_guard as guard
from libbroker.launcher.hostrun_fs import hash_fd
from libpolicy.hostrun import Table

MIB = 1 << 20
FSMONITOR = "[core]\n\tfsmonitor = \"echo ran > {canary}/{name}; false\"\n"


ALL_GIT = (("status", "--short"), ("commit", "-q", "--allow-empty", "-m", "host"),
           ("rebase", "--continue"), ("st",))


def git_everywhere(work: Path, canary: Path, only: tuple[str, ...] = (),
                   commands: tuple[tuple[str, ...], ...] = ALL_GIT) -> list[str]:
    """The host's git from every directory of the workdir (links not followed; loose object
    directories, which hold only objects, skipped), or ``only`` those; the canaries."""
    for top, dirs, _ in os.walk(work):
        if only and os.path.relpath(top, work) not in only:
            continue
        if top.endswith("/objects"):
            dirs[:] = [d for d in dirs if len(d) != 2 or (os.listdir(os.path.join(top, d))
                       and any(os.path.isdir(os.path.join(top, d, x))
                               for x in os.listdir(os.path.join(top, d))))]
        for args in commands:
            git(Path(top), "-c", "safe.directory=*", *args, check=False)
    return sorted(p.name for p in canary.iterdir())


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return make_work(tmp_path)


def make_work(tmp_path: Path) -> Path:
    """A repository with a submodule and a nested repository, and a canary dir beside it."""
    lib, work = tmp_path / "lib", tmp_path / "work dir"  # a space in the workdir's path
    lib.mkdir()
    git(lib, "init", "-q")
    git(lib, "commit", "-q", "--allow-empty", "-m", "lib")
    work.mkdir()
    git(work, "init", "-q")
    (work / "a.txt").write_text("a\n")
    git(work, "submodule", "add", "-q", str(lib), "m")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "init")
    (work / "sub").mkdir()
    git(work / "sub", "init", "-q")
    git(work / "sub", "commit", "-q", "--allow-empty", "-m", "s")
    (tmp_path / "canary").mkdir()
    return work


def sweep_after(work: Path, attack: Callable[[], None], **kw: bool) -> list[str]:
    state = work.parent / "state"
    snap = guard.scan(str(work), Table(), state=str(state))
    attack()
    lines = guard.sweep(snap, str(state), **kw)
    assert guard.sweep(snap, str(state), **kw) == []  # nothing left to do
    for line in lines:
        assert line.startswith("agent-sandbox: ") and line.isprintable(), line
    return lines


def _fsmonitor_repo(at: Path, canary: Path, name: str) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(at.parent, os.O_RDONLY)
    try:
        plant_bare(fd, at.name, FSMONITOR.format(canary=canary, name=name))
    finally:
        os.close(fd)


def attacks(work: Path, canary: Path) -> dict[str, Callable[[], None]]:
    def nested_module() -> None:  # a git dir nested inside another module's git dir
        _fsmonitor_repo(work / ".git/modules/m/x/g", canary, "nested_module")
        (work / "evil").mkdir()
        (work / "evil/.git").write_text("gitdir: ../.git/modules/m/x/g\n")

    def deep_module() -> None:  # 17 levels below .git/modules
        deep = work / ".git/modules" / "/".join("abcdefghijklmnopq")
        _fsmonitor_repo(deep, canary, "deep_module")
        (work / "evil").mkdir()
        (work / "evil/.git").write_text(f"gitdir: ../{deep.relative_to(work)}\n")

    def link_gitdir() -> None:  # lexically .git/modules/x; the kernel goes through objects
        (work / ".git/objects/evilrepo").mkdir()
        _fsmonitor_repo(work / ".git/objects/.git/modules/x", canary, "link_gitdir")
        os.symlink(".git/objects/evilrepo", work / "lnk")
        (work / "evil").mkdir()
        (work / "evil/.git").write_text("gitdir: ../lnk/../.git/modules/x\n")

    def many_hooks() -> None:  # more than 5000 entries in a held directory
        for i in range(5001):
            (work / f".git/hooks/empty{i}").touch()
        plant_hook(work / ".git/hooks", canary, "many_hooks")

    def many_vscode() -> None:
        (work / ".vscode").mkdir(exist_ok=True)
        for i in range(5001):
            (work / f".vscode/e{i}").touch()
        plant_hook(work / ".git/modules/m/hooks", canary, "many_vscode")

    def rebase_merge() -> None:  # an exec line runs at the rebase --continue status suggests
        rm = work / ".git/rebase-merge"
        rm.mkdir()
        head = git(work, "rev-parse", "HEAD").stdout.strip()
        for name, text in (("git-rebase-todo", f"exec echo ran > {canary}/rebase_merge\n"),
                           ("head-name", "refs/heads/main"), ("onto", head),
                           ("orig-head", head), ("interactive", ""), ("done", "")):
            (rm / name).write_text(text + "\n")

    def sequencer() -> None:
        seq = work / ".git/sequencer"
        seq.mkdir()
        (seq / "todo").write_text(f"exec echo ran > {canary}/sequencer\n")
        (seq / "head").write_text(git(work, "rev-parse", "HEAD").stdout)
        (work / ".git/CHERRY_PICK_HEAD").write_text(git(work, "rev-parse", "HEAD").stdout)

    def alias_c() -> None:  # not a ! alias: -c carries the command
        git(work, "config", "alias.st", f"-c core.fsmonitor='echo ran > {canary}/alias_c; "
            "false' status")

    def bare_in_objects() -> None:  # a repository anywhere, under any name
        _fsmonitor_repo(work / ".git/objects/ab/evil", canary, "bare_in_objects")
        plant_hook(work / ".git/objects/ab/evil/hooks", canary, "bare_hook", "pre-commit")

    def include_target() -> None:  # the repository's own include.path, inside the workdir
        (work / "tools/git.cfg").write_text(FSMONITOR.format(canary=canary, name="include"))

    def hooks_path() -> None:  # husky's .husky/, named by the repository's core.hooksPath
        plant_hook(work / ".husky", canary, "husky")

    def commondir_new_git() -> None:
        _fsmonitor_repo(work / ".gitc", canary, "commondir")
        (work / ".git/commondir").write_text("../.gitc\n")
        (work / "sub2").mkdir()
        (work / "sub2/.git").write_text("gitdir: ../.gitc\n")

    return {f.__name__: f for f in (nested_module, deep_module, link_gitdir, many_hooks,
                                    many_vscode, rebase_merge, sequencer, alias_c,
                                    bare_in_objects, include_target, hooks_path,
                                    commondir_new_git)}


ATTACKS = sorted(attacks(Path("/"), Path("/")))


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_runs_nothing_after_the_sweep(work: Path, name: str) -> None:
    canary = work.parent / "canary"
    (work / "tools").mkdir()
    (work / "tools/git.cfg").write_text("[user]\n\tname = shared\n")
    git(work, "config", "include.path", "../tools/git.cfg")
    (work / ".husky").mkdir()
    git(work, "config", "core.hooksPath", ".husky")
    lines = sweep_after(work, attacks(work, canary)[name])
    assert lines, "the sweep said nothing"
    assert git_everywhere(work, canary) == []
    assert git(work, "log", "--oneline").stdout.count("init") == 1


def test_the_attacks_are_real_without_the_sweep(work: Path) -> None:
    """Unswept, the canaries do appear: each attack would run on the host."""
    canary = work.parent / "canary"
    (work / "tools").mkdir()
    (work / "tools/git.cfg").write_text("[user]\n\tname = shared\n")
    git(work, "config", "include.path", "../tools/git.cfg")
    for name in ("nested_module", "link_gitdir", "rebase_merge", "alias_c", "include_target"):
        attacks(work, canary)[name]()
        git_everywhere(work, canary, only=(".", "evil"))
        shutil.rmtree(work / "evil", ignore_errors=True)
        shutil.rmtree(work / ".git/rebase-merge", ignore_errors=True)
    assert {"nested_module", "link_gitdir", "rebase_merge", "alias_c", "include"} <= set(
        p.name for p in canary.iterdir())


SIZES = [0, MIB - 1, MIB, MIB + 1, 100 * MIB]


def _digest(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def test_the_users_originals_of_any_size_come_back_byte_for_byte(work: Path) -> None:
    """The data-loss case: the session edits settings.json beside big files (one of them a
    1 TiB sparse file); the whole .vscode/ comes back, and the saved copies are gone."""
    vs = work / ".vscode"
    vs.mkdir()
    (vs / "settings.json").write_text("{}\n")
    block = os.urandom(MIB + 1)
    for size in SIZES:
        with open(vs / f"f{size}", "wb") as fh:
            for at in range(0, size, MIB + 1):
                fh.write(block[: min(MIB + 1, size - at)])
    with open(vs / "sparse", "wb") as fh:  # 1 TiB, one 4 KiB extent in the middle
        fh.seek(1 << 39)
        fh.write(os.urandom(4096))
        fh.truncate(1 << 40)
    before = {p.name: _digest(p) for p in vs.iterdir()}

    def attack() -> None:
        (vs / "settings.json").write_text('{"task": "evil"}\n')

    lines = sweep_after(work, attack)
    assert any(line.startswith("agent-sandbox: .vscode [vscode]") for line in lines), lines
    assert {p.name: _digest(p) for p in vs.iterdir()} == before
    assert (vs / "sparse").stat().st_blocks * 512 < 64 * MIB  # still sparse
    state = work.parent / "state/quarantine"
    assert not [p for p in state.iterdir() if p.name.endswith(".originals")]


def test_a_non_utf8_name_keeps_the_lines_and_escapes_them(work: Path) -> None:
    name = os.fsdecode(b"x\xff\x1b]52;c;ZXZpbA==\x07y")

    def attack() -> None:
        (work / name).mkdir()
        (work / name / ".envrc").write_text("x")

    lines = sweep_after(work, attack)
    line = next(x for x in lines if "[envrc]" in x)
    assert "\x1b" not in line and "\\x1b" in line and "\\xff" in line
    log = next((work.parent / "state/quarantine").rglob("sweep.log")).read_bytes()
    assert b"\x1b" not in log and line.encode() in log


def test_an_unreadable_git_dir_as_an_ordinary_user() -> None:
    """chmod 0311 .git: git still works, the sweep (as that user) gives itself the owner's
    bits back and restores the hooks; nothing is skipped."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
    from as_user import ordinary_user

    user = ordinary_user()
    if user.unavailable:
        pytest.skip(user.unavailable)
    base = Path(tempfile.mkdtemp(prefix="hostrun-user-", dir="/tmp"))
    try:
        base.chmod(0o755)
        work = make_work(base)
        canary, state = base / "canary", base / "state"
        state.mkdir()
        user.own(work, canary, state)

        def session() -> int:
            snap = guard.scan(str(work), Table(), state=str(state))
            plant_hook(work / ".git/hooks", canary, "chmod")
            plant_hook(work / "sub/.git/hooks", canary, "chmod_sub")
            os.chmod(work / ".git/hooks", 0o311)
            os.chmod(work / "sub/.git", 0o311)
            os.chmod(work / ".git", 0o311)
            lines = guard.sweep(snap, str(state))
            return 0 if len([x for x in lines if "[git-hooks]" in x]) == 2 else 1

        assert user.call(session) == 0
        assert not (work / ".git/hooks/pre-commit").exists()
        assert not (work / "sub/.git/hooks/pre-commit").exists()
        assert git_everywhere(work, canary) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_hostile_names_print_commands_that_paste_as_they_say(work: Path) -> None:
    """Each printed command passes bash -n, and run in a real shell it applies the session's
    version: to the named path only (no PWNED anywhere), also in a workdir with a space."""
    names = ["x y;touch PWNED;z", "a'b\"c", "nl\nx", "esc\x1b[2Jx", os.fsdecode(b"u\xfe"),
             "$(touch PWNED)", "-rf"]

    def attack() -> None:
        for i, name in enumerate(names):
            (work / name).mkdir()
            (work / name / ".envrc").write_text(f"session {i}\n")

    lines = sweep_after(work, attack)
    commands = [x.split("to apply the session's version: ", 1)[1] for x in lines
                if "to apply the session's version: " in x]
    assert len(commands) == len(names)
    for cmd in commands:
        subprocess.run(["bash", "-n", "-c", cmd], check=True)
        subprocess.run(["bash", "-c", cmd], check=True, cwd=work.parent)
    for i, name in enumerate(names):
        assert (work / name / ".envrc").read_text() == f"session {i}\n"
    assert not list(work.parent.rglob("PWNED"))


def test_an_entry_replaced_by_a_special_file_or_an_unreadable_one_is_moved_aside(
        work: Path) -> None:
    def attack() -> None:
        os.unlink(work / ".git/config")
        os.mkfifo(work / ".git/config")
        (work / ".envrc").write_text("x")
        os.chmod(work / ".envrc", 0)

    lines = sweep_after(work, attack)
    assert stat.S_ISREG((work / ".git/config").lstat().st_mode)
    assert not (work / ".envrc").exists()
    assert any(".git/config" in line for line in lines)


# --- random trees ----------------------------------------------------------------------

PLACES = ["", "sub", "a", "a/b", ".git", ".git/modules", ".git/modules/m", ".git/objects",
          ".git/refs", "sub/.git", ".git/modules/m/x"]


def _plant(work: Path, canary: Path, op: tuple[str, int, int, str], n: int) -> None:
    kind, i, j, name = op
    here = work / PLACES[i % len(PLACES)]
    there = work / PLACES[j % len(PLACES)]
    here.mkdir(parents=True, exist_ok=True)
    target = here / name
    if target.exists() or target.is_symlink():
        return
    if kind == "bare":
        _fsmonitor_repo(target, canary, f"bare{n}")
        plant_hook(target / "hooks", canary, f"barehook{n}")
    elif kind == "gitlink":
        target.mkdir()
        (target / ".git").write_text(f"gitdir: {os.path.relpath(there, target)}\n")
    elif kind == "dotgit":
        (here / ".git").exists() or (here / ".git").write_text(
            f"gitdir: {os.path.relpath(there, here)}\n")
    elif kind == "link":
        os.symlink(os.path.relpath(there, here), target)
    elif kind == "hook":
        plant_hook(there / "hooks", canary, f"hook{n}")
    elif kind == "chmod":
        os.chmod(here, 0o311)


OPS = ["bare", "gitlink", "dotgit", "link", "hook", "chmod"]


def test_random_trees_leave_nothing_for_the_hosts_git(tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    """Random plants of bare repositories, gitlinks (to anywhere, through links), links,
    hooks and chmods inside git dirs and out: after the sweep, the host's git from every
    directory runs nothing."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    op = st.tuples(st.sampled_from(OPS), st.integers(0, 20), st.integers(0, 20),
                   st.sampled_from(["r", ".git", "objects", "x y", "HEAD", "hooks"]))

    template = make_work(tmp_path_factory.mktemp("template"))

    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(op, min_size=1, max_size=6))
    def run(ops: list[tuple[str, int, int, str]]) -> None:
        base = tmp_path_factory.mktemp("random")
        work = base / template.name
        shutil.copytree(template, work, symlinks=True)
        canary = base / "canary"
        canary.mkdir()

        def attack() -> None:
            for n, one in enumerate(ops):
                _plant(work, canary, one, n)

        sweep_after(work, attack)
        assert git_everywhere(work, canary, commands=ALL_GIT[:2]) == [], ops
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)

    run()
