"""Real sessions on both backends plant git hooks and config; the host's next git runs none.

Each attack runs as the session's command (``agent-sandbox run --sandbox=...``)
in a workdir holding a repository, a nested repository and a submodule.  Then
the person's ordinary ``git status`` and ``git commit`` run on the host in
every repository; a planted command would write its canary.  The agent's
other work in the workdir must be intact.  The janitor's sweep is tested by
killing the launcher with SIGKILL mid-session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launcher_world import World
from test_hostrun_sweep import git, host_uses_git

HOOK = "printf '#!/bin/sh\\necho ran > {canary}/{name}\\n' > {path} && chmod +x {path}"


def attacks(canary: Path, outside: Path) -> dict[str, str]:
    def hook(name: str, path: str) -> str:
        return HOOK.format(canary=canary, name=name, path=path)

    return {
        "hook": hook("hook", ".git/hooks/pre-commit"),
        "fsmonitor": f"git config core.fsmonitor 'echo ran > {canary}/fsmonitor; false'",
        "hooks_path": f"mkdir -p evil && {hook('hooks_path', 'evil/pre-commit')} "
                      "&& git config core.hooksPath evil",
        "rename": "mv .git .git-away && cp -r .git-away .git && "
                  + hook("rename", ".git/hooks/pre-commit"),
        "commondir": f"cp -r .git .gitc && {hook('commondir', '.gitc/hooks/pre-commit')} && "
                     "echo ../.gitc > .git/commondir",
        "nested": hook("nested", "sub/.git/hooks/pre-commit"),
        "submodule": hook("submodule", ".git/modules/m/hooks/pre-commit"),
        "gitlink": f"cp -r sub/.git subgit && {hook('gitlink', 'subgit/hooks/pre-commit')} && "
                   "rm -rf sub/.git && echo 'gitdir: ../subgit' > sub/.git",
        "new_repo": f"git init -q newrepo && {hook('new_repo', 'newrepo/.git/hooks/pre-commit')}"
                    f" && git -C newrepo config core.fsmonitor 'echo ran > {canary}/newfsm'",
        "link": f"rm -rf .git/hooks; ln -s {outside}/hooks .git/hooks",
    }


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


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_no_planted_hook_runs_after_a_session(world: World, tmp_path: Path, backend: str) -> None:
    canary, outside = tmp_path / "canary", tmp_path / "outside"
    canary.mkdir()
    (outside / "hooks").mkdir(parents=True)
    (outside / "hooks/pre-commit").write_text(f"#!/bin/sh\necho ran > {canary}/link\n")
    (outside / "hooks/pre-commit").chmod(0o755)
    make_repos(world, tmp_path)
    ran: dict[str, list[str]] = {}
    for name, script in attacks(canary, outside).items():
        work = f"echo {name} > agent-{name}.txt; "
        done = world.run("sh", "-c", work + script + "; exit 0", sandbox=backend, timeout=60)
        assert done.returncode == 0, done.stderr
        if os.environ.get("HOSTRUN_SHOW"):
            print(backend, name, done.stderr)
        host_uses_git(world.workdir)
        ran[name] = sorted(p.name for p in canary.iterdir())
        assert (world.workdir / f"agent-{name}.txt").read_text() == f"{name}\n"
    assert ran == {name: [] for name in ran}, ran
    assert git(world.workdir, "log", "--oneline").stdout.count("init") == 1
    assert world.leftovers() == []


def test_the_janitor_sweeps_after_a_killed_launcher(world: World, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    make_repos(world, tmp_path)
    planted = world.workdir / "sub/.git/hooks/pre-commit"
    script = HOOK.format(canary=canary, name="janitor", path="sub/.git/hooks/pre-commit")
    # (the live guard, hostrun_live, moves the hook aside as it appears: the
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
    while not list(quarantine.rglob("sweep.log")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the log is written last, once the sweep is done
    assert not planted.exists()
    logs = list(quarantine.rglob("sweep.log"))
    assert logs and "sub/.git/hooks" in logs[0].read_text()
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
