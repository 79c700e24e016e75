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
    assert not list((world.home / ".local/state/agent-sandbox/live").glob("*"))


PLANT = ("git config core.fsmonitor 'echo ran > {canary}/fsmonitor; false' && "
         "git config alias.st '-c core.fsmonitor=true status' && "
         "git config include.path ../evil.cfg && git config user.name Agent && "
         "sleep 0.3 && touch planted && {wait}")


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
        for key in ("core.fsmonitor", "alias.st", "include.path"):  # during the session
            assert git(work, "config", "--get", key, check=False).stdout == "", key
        git(work, "status", "--short")
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    for key in ("core.fsmonitor", "alias.st", "include.path"):  # and after
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
