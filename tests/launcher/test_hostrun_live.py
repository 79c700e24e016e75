"""Git config that works inside, and no window for a concurrent host git (hostrun_live).

Real sessions on both backends run the ordinary git commands that write
``.git/config`` (remote add, config user.email, push -u, branch -D, checkout
--track), then the host's git sees their keys; a key that runs commands,
set inside, is on the host neither while the session runs nor after, and
its quarantine line is printed.  A launcher killed by SIGKILL mid-session
leaves the config a regular file again once the janitor is done.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
from launcher_world import World
from test_hostrun_sweep import git

ORDINARY = (
    "set -e; git remote add origin ./remote.git; git config user.email agent@example.com; "
    "git push -q -u origin HEAD:main; git branch -q --track gone origin/main; "
    "git branch -q -D gone; git checkout -q --track -b feature origin/main; "
    "git config --list --local > inside.txt"
)


def _repo(world: World) -> Path:
    work = world.workdir
    git(work, "init", "-q", "-b", "trunk")
    (work / "a.txt").write_text("a\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-q", "-m", "init")
    git(work, "init", "-q", "--bare", "remote.git")
    (work / ".git/config").chmod(0o640)
    return work


def _unfinished(live: Path) -> list[Path]:
    """Live dirs of sessions not finished (a finished one is set aside as .done-*, removed by
    the next start)."""
    return [p for p in live.iterdir() if not p.name.startswith(".done-")]


def _wait(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), path


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_ordinary_git_config_writes_work_inside_and_stay(world: World, backend: str) -> None:
    work = _repo(world)
    done = world.run("sh", "-c", ORDINARY, sandbox=backend)
    assert done.returncode == 0, done.stderr
    config = work / ".git/config"
    st = config.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    listed = git(work, "config", "--list", "--local").stdout.splitlines()
    for line in ("remote.origin.url=./remote.git", "user.email=agent@example.com",
                 "branch.trunk.remote=origin", "branch.trunk.merge=refs/heads/main",
                 "branch.feature.remote=origin", "branch.feature.merge=refs/heads/main"):
        assert line in listed, (line, listed)
    assert not any(x.startswith("branch.gone.") for x in listed)
    assert git(work, "rev-parse", "--abbrev-ref", "trunk@{upstream}").stdout.strip() == (
        "origin/main")
    assert "agent-sandbox: .git/config" not in done.stderr
    assert not _unfinished(world.home / ".local/state/agent-sandbox/live")


PLANT = ("git config core.fsmonitor 'echo ran > {canary}/fsmonitor; false' && "
         "git config alias.st '-c core.fsmonitor=true status' && "
         "git config include.path ../evil.cfg && git config user.name Agent && "
         "{{ rm -f .git/config; printf '[core]\\n\\tpager = evil\\n' >> .git/config; }} "
         "2>/dev/null; sleep 0.3 && touch planted && {wait}")


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_command_keys_set_inside_never_reach_the_host(world: World, tmp_path: Path,
                                                      backend: str) -> None:
    work = _repo(world)
    canary = tmp_path / "canary"
    canary.mkdir()
    script = PLANT.format(canary=canary, wait="while [ ! -e go ]; do sleep 0.05; done")
    proc = world.launch("sh", "-c", script, sandbox=backend)
    try:
        _wait(work / "planted")
        for key in ("core.fsmonitor", "alias.st", "include.path", "core.pager"):  # during
            assert git(work, "config", "--get", key, check=False).stdout == "", key
        git(work, "status", "--short")
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    for key in ("core.fsmonitor", "alias.st", "include.path", "core.pager"):  # and after
        assert git(work, "config", "--get", key, check=False).stdout == "", key
    assert git(work, "config", "--get", "user.name").stdout.strip() == "Agent"
    git(work, "status", "--short")
    assert list(canary.iterdir()) == []
    line = next(x for x in err.splitlines() if x.startswith("agent-sandbox: .git/config "))
    assert "core.fsmonitor" in line and "alias.st" in line and "include.path" in line
    assert stat.S_ISREG((work / ".git/config").lstat().st_mode)


def test_a_killed_launcher_leaves_a_regular_config(world: World) -> None:
    work = _repo(world)
    proc = world.launch("sh", "-c", "git config user.email k@example.com && touch planted "
                        "&& exec sleep 60", sandbox="bwrap")
    _wait(work / "planted")
    assert (work / ".git/config").is_symlink()  # the host's copy, while the session runs
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while (work / ".git/config").is_symlink() and time.monotonic() < deadline:
        time.sleep(0.05)
    st = (work / ".git/config").lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert git(work, "config", "--get", "user.email").stdout.strip() == "k@example.com"
    deadline = time.monotonic() + 15
    while world.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert world.leftovers() == []


LIVE_PLANTS = (
    "mkdir -p .gitc/objects .gitc/refs .gitc/hooks && echo 'ref: refs/heads/main' > .gitc/HEAD; "
    "printf '[core]\\n\\tfsmonitor = \"echo gitc > {canary}/gitc; false\"\\n' > .gitc/config; "
    "echo ../.gitc > .git/commondir; "
    "mkdir -p sub2 && echo 'gitdir: ../.gitc' > sub2/.git; "
    "printf '#!/bin/sh\\necho hook > {canary}/hook\\n' > .git/hooks/post-index-change; "
    "chmod +x .git/hooks/post-index-change; "
    "touch planted; while [ ! -e go ]; do sleep 0.05; done"
)


def _host_read(path: Path) -> bytes:
    """What a host process reads at ``path``: nothing where the live gate (root) refuses it
    (a file of a git dir the session made)."""
    try:
        return path.read_bytes()
    except PermissionError:
        return b""


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_plants_are_neutralized_while_the_session_runs(world: World, tmp_path: Path,
                                                       backend: str) -> None:
    """A commondir, a gitlink, a new git dir's config and a hook, planted once: gone from the
    host's view while the session still runs, so the person's git status runs none."""
    work = _repo(world)
    canary = tmp_path / "canary"
    canary.mkdir()
    proc = world.launch("sh", "-c", LIVE_PLANTS.format(canary=canary), sandbox=backend)
    try:
        _wait(work / "planted")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            (work / ".git/commondir").exists() or (work / "sub2/.git").exists()
            or (work / ".git/hooks/post-index-change").exists()
            or b"fsmonitor" in _host_read(work / ".gitc/config")
        ):
            time.sleep(0.02)
        assert not (work / ".git/commondir").exists()
        assert not (work / "sub2/.git").exists()
        assert not (work / ".git/hooks/post-index-change").exists()
        (work / "a.txt").touch()
        # Where the live gate runs (root), git may be refused an open for a second after
        # a neutralization (EPERM, exit 128): it stops, and runs nothing.
        git(work, "status", "--short", check=False)
        git(work / "sub2", "status", "--short", check=False)
        assert list(canary.iterdir()) == []  # while the session runs
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    for entry in (".git/commondir", "sub2/.git", ".gitc/config"):
        assert any(line.startswith(f"agent-sandbox: {entry} ") for line in err.splitlines()), (
            entry, err)
    git(work, "status", "--short")
    assert list(canary.iterdir()) == []


def test_links_left_by_a_dead_session_are_repaired_at_the_next_start(world: World) -> None:
    """Launcher and janitor both gone (a reboot): the link still reads the host's copy, and
    the next session's start turns it back into a file; a live session's is left alone."""
    from libbroker.launcher import hostrun_gitconfig, hostrun_scan
    from libpolicy.hostrun import Table

    work = _repo(world)
    state = world.home / ".local/state/agent-sandbox"
    snap = hostrun_scan.scan(str(work), Table())
    live = hostrun_gitconfig.start(snap, str(state), "", swap=True)
    config = work / ".git/config"
    assert config.is_symlink()
    assert hostrun_gitconfig.repair(str(state)) == []  # its lock is held: a live session's
    assert config.is_symlink()
    git(work, "config", "user.name", "Person")  # host git meanwhile: writes the host's copy
    live.close()  # the launcher is gone
    done = world.run("true", sandbox="nono")
    assert done.returncode == 0, done.stderr
    assert "a regular file again" in done.stderr
    st = config.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert git(work, "config", "--get", "user.name").stdout.strip() == "Person"
    assert not _unfinished(state / "live")


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_as_an_ordinary_user(backend: str) -> None:
    """The same, as a uid with no privilege: the private copy's bind needs the user
    namespace bwrap (and the Landlock helper, where the kernel allows one) makes."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="hostrun-live-user-"))  # pytest's is 0700
    tmp_path.chmod(0o755)
    try:
        _as_user(tmp_path, backend)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _as_user(tmp_path: Path, backend: str) -> None:
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
    from as_user import ordinary_user

    for _ in range(5):  # its scan of /proc races with processes that end meanwhile
        try:
            user = ordinary_user()
            break
        except FileNotFoundError:
            continue
    if user.unavailable:
        pytest.skip(user.unavailable)
    home, work, runtime = tmp_path / "home", tmp_path / "work", tmp_path / "run"
    for d in (home, work, runtime):
        d.mkdir()
    (runtime).chmod(0o700)
    git(work, "init", "-q", "-b", "trunk")
    git(work, "commit", "-q", "--allow-empty", "-m", "init")
    config = tmp_path / "config.toml"
    config.write_text(f'workdir = "{work}"\ntoken_command = ""\nstart_timeout = 60\n')
    user.own(home, work, runtime, config)
    env = user.env(home, XDG_RUNTIME_DIR=str(runtime), GIT_CONFIG_NOSYSTEM="1")
    env["PATH"] = os.path.dirname(sys.executable) + ":" + env.get("PATH", "/usr/bin:/bin")
    inside = ("git config user.email u@example.com && git remote add origin ./x && "
              "git config core.fsmonitor 'touch fsm-ran' && git config --get core.fsmonitor && "
              "{ rm .git/config 2>/dev/null && echo REMOVED; true; }")
    done = subprocess.run(
        user.argv(["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}", "--",
                   "sh", "-c", inside]),
        env=env, cwd=work, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "touch fsm-ran", done.stderr  # set inside; the link stays
    listed = subprocess.run(user.argv(["git", "config", "--list", "--local"]), env=env, cwd=work,
                            capture_output=True, text=True, timeout=30).stdout.splitlines()
    assert "user.email=u@example.com" in listed and "remote.origin.url=./x" in listed
    assert not any(x.startswith("core.fsmonitor") for x in listed)
    assert stat.S_ISREG((work / ".git/config").lstat().st_mode)
    assert "core.fsmonitor" in done.stderr


def test_a_dead_sessions_record_whose_workdir_is_gone_is_dropped(world: World) -> None:
    """A session that ended without putting its configs back, in a workdir removed since
    (``git worktree remove``, a deleted temporary directory): one line, then sessions run."""
    import shutil

    from libbroker.launcher import hostrun_gitconfig, hostrun_scan
    from libpolicy.hostrun import Table

    gone = world.root / "gone"
    shutil.copytree(_repo(world), gone, symlinks=True)
    state = world.home / ".local/state/agent-sandbox"
    live = hostrun_gitconfig.start(hostrun_scan.scan(str(gone), Table()), str(state), "",
                                   swap=True)
    live.close()  # the launcher is gone
    shutil.rmtree(gone)
    said = []
    for _ in range(2):
        done = world.run("true", sandbox="nono")
        assert done.returncode == 0, done.stderr
        said.append(done.stderr.count("gone since a session ended there"))
    assert said == [1, 0], said
    assert not _unfinished(state / "live")


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
@pytest.mark.parametrize("swap", ["link", "fifo", "huge"])
def test_a_private_copy_that_is_no_config_is_refused(world: World, backend: str,
                                                     swap: str) -> None:
    """The session replaces its private copy with a link to a host file, a FIFO or a file
    over the bound: nothing of it is read into the host's config (no hang), one line."""
    work = _repo(world)
    before = git(work, "config", "--list", "--local").stdout
    make = {"link": 'ln -s /etc/passwd "$p"', "fifo": 'mkfifo "$p"',
            "huge": 'head -c 300000 /dev/zero | tr "\\0" "#" > "$p.new" && mv "$p.new" "$p"'}[swap]
    script = f'p=$(readlink .git/config) && rm -f "$p" && {make} && echo done'
    done = world.run("sh", "-c", script, sandbox=backend, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert git(work, "config", "--list", "--local").stdout == before
    assert stat.S_ISREG((work / ".git/config").lstat().st_mode)
    assert "(not a regular file of at most 256 KiB)" in done.stderr


@pytest.mark.parametrize("size", [0, 1, (256 << 10) - 1, 256 << 10, (256 << 10) + 1])
def test_the_config_bound(tmp_path: Path, size: int) -> None:
    from libbroker.launcher.hostrun_files import MAX_CONFIG, read_small

    (tmp_path / "config").write_bytes(b"#" * size)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = read_small(fd, "config")
    finally:
        os.close(fd)
    assert got == (b"#" * size if size <= MAX_CONFIG else None)


def test_without_a_mount_namespace_the_file_is_watched_and_cleaned(tmp_path: Path) -> None:
    """Landlock where user namespaces are refused: no private copy; each write of the
    config is merged at once, the refused keys rewritten away under git's lock."""
    import subprocess

    from libbroker.launcher import hostrun_live, hostrun_scan
    from libpolicy.hostrun import Table

    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    snap = hostrun_scan.scan(str(work), Table())
    watcher = hostrun_live.begin(snap, str(tmp_path / "state"), "", swap=False)
    watcher.start()
    watcher.wait_ready()
    try:
        for key, value in (("core.fsmonitor", "touch ran"), ("user.email", "e@example.com"),
                           ("alias.x", "!sh"), ("remote.o.url", "./x")):
            for _ in range(20):  # git fails at once when the guard holds config.lock
                if subprocess.run(["git", "config", key, value], cwd=work,
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"fsmonitor" in (work / ".git/config").read_bytes():
            time.sleep(0.01)
        time.sleep(0.2)
        listed = git(work, "config", "--list", "--local").stdout.splitlines()
    finally:
        lines = hostrun_live.end(watcher, snap)
    assert "user.email=e@example.com" in listed and "remote.o.url=./x" in listed
    assert not any(x.startswith(("core.fsmonitor", "alias.x")) for x in listed), listed
    assert any("core.fsmonitor" in line and "alias.x" in line for line in lines), lines


def _clone(canary: Path) -> str:
    # The plants may be gone before the next line runs (the live guard): no set -e there.
    return ("git clone -q ./remote.git fresh && git -C fresh status --short && "
            "git init -q made && echo cloned; "
            f"printf '#!/bin/sh\\ntouch {canary}\\n' > made/.git/hooks/pre-commit; "
            f"chmod +x made/.git/hooks/pre-commit; git -C made config core.fsmonitor "
            f"'touch {canary}'; true")


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_clone_or_init_in_the_workdir_works_and_its_plants_do_not_stay(
        world: World, tmp_path: Path, backend: str) -> None:
    """git init and clone write a new .git's templates and config before it is a git dir by
    git's own test: the live guard judges them as the new repository (samples and safe keys
    stay), so the clone succeeds; a hook or a command key planted in it is still gone."""
    work = _repo(world)
    canary = tmp_path / "canary"
    done = world.run("sh", "-c", _clone(canary), sandbox=backend)
    assert done.returncode == 0 and "cloned" in done.stdout, done.stderr
    assert git(work / "fresh", "remote", "get-url", "origin").stdout.strip().endswith("remote.git")
    assert (work / "fresh/.git/hooks/pre-commit.sample").exists()
    assert not (work / "made/.git/hooks/pre-commit").exists()
    (work / "made/a").write_text("a\n")
    git(work / "made", "add", "a")
    git(work / "made", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    git(work / "made", "status")
    assert not canary.exists()
