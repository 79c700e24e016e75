"""The guard's session paths: the janitor's sweep after a launcher killed by SIGKILL
mid-session, and the sweep's lines on stderr.

The attacks themselves, through real sessions on both backends as root and as an
ordinary user, are test_hostrun_attack_sessions.py's (one session per cell).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from launcher_world import World
from test_hostrun_sweep import git, host_uses_git

HOOK = "printf '#!/bin/sh\\necho ran > {canary}/{name}\\n' > {path} && chmod +x {path}"


def make_repos(world: World, tmp: Path) -> None:
    work = world.workdir
    lib = tmp / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    git(lib, "commit", "-q", "--allow-empty", "-m", "lib")
    git(work, "init", "-q")
    (work / "a.txt").write_text("a\n")
    git(work, "submodule", "add", "-q", str(lib), "m")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "init")
    (work / "sub").mkdir()
    git(work / "sub", "init", "-q")
    git(work / "sub", "commit", "-q", "--allow-empty", "-m", "s")


def test_the_janitor_sweeps_after_a_killed_launcher(world: World, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    make_repos(world, tmp_path)
    planted = world.workdir / "sub/.git/commondir"
    # The existing hooks are held read-only (bwrap, and Landlock in its helper's mount
    # namespace): the plant is a commondir naming a copy with a hook of its own.
    script = ("mkdir -p sub/.gitc/objects sub/.gitc/refs sub/.gitc/hooks && "
              + HOOK.format(canary=canary, name="janitor", path="sub/.gitc/hooks/pre-commit")
              + " && echo ../.gitc > sub/.git/commondir")
    # (the live guard, hostrun_live, moves it aside as it appears: the
    # session says when it planted)
    proc = world.launch("sh", "-c", script + "; touch planted && exec sleep 60",
                        sandbox="nono")
    deadline = time.monotonic() + 30
    while not (world.workdir / "planted").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (world.workdir / "planted").exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    quarantine = world.home / ".local/state/agent-sandbox/quarantine"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            "sub/.git/commondir" in log.read_text() for log in quarantine.rglob("sweep.log")):
        time.sleep(0.05)  # the watcher's lines go in as they happen, the sweep's after
    assert not planted.exists()
    logs = list(quarantine.rglob("sweep.log"))
    assert logs and "sub/.git/commondir" in logs[0].read_text()
    host_uses_git(world.workdir)
    assert list(canary.iterdir()) == []
    deadline = time.monotonic() + 15
    while world.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert world.leftovers() == []


def test_the_sweep_lines_reach_stderr(world: World) -> None:
    git(world.workdir, "init", "-q")
    done = world.run("sh", "-c", "echo 'export X=1' > .envrc", sandbox="nono")
    assert done.returncode == 0
    line = next(x for x in done.stderr.splitlines() if x.startswith("agent-sandbox: .envrc"))
    assert "[envrc]" in line and "mv -T --" in line
    assert not (world.workdir / ".envrc").exists()
    subprocess.run(["sh", "-c", line.split("to apply the session's version: ", 1)[1]],
                   check=True)
    assert (world.workdir / ".envrc").read_text() == "export X=1\n"


def test_a_finished_sessions_live_dir_goes_at_the_next_start(tmp_path: Path) -> None:
    """A finished session sets its live dir aside in one rename (.done-*); the next
    guard's start removes it meanwhile, and leaves an unfinished one to repair()."""
    from libbroker.launcher import hostrun_guard
    from libpolicy.hostrun import Table

    state, work, rt = tmp_path / "state", tmp_path / "work", tmp_path / "rt"
    for d in (state / "live/.done-s1-ab/host/0", state / "live/20260101-000000-1", work, rt):
        d.mkdir(parents=True)
    (state / "live/.done-s1-ab/host/0/config").write_text("[core]\n")
    guard = hostrun_guard.Guard(str(work), Table(), str(rt), str(state))
    guard.wait()
    assert guard.finish() == []
    assert sorted(p.name for p in (state / "live").iterdir()) == ["20260101-000000-1"]
