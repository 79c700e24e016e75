"""Issue 24's attacks through real sessions: both backends, as root and as an ordinary user.

One session per cell runs every attack of test_hostrun_attacks.py as the
agent would (a shell script inside ``agent-sandbox run``), plus the
``chmod 0311 .git`` that only hides a repository from an ordinary user, and
the data-loss case (``.vscode/`` with a 2 MB file beside the settings the
session edits).  Under bwrap much of it is refused inside already (held
read-only); what gets through is the sweep's.  Afterwards the host's real
git runs from every directory of the workdir (status, commit,
``rebase --continue``, the alias): no canary outside the workdir may
appear, the 2 MB original is back byte for byte, and every printed command
passes ``bash -n``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_hostrun_attacks import git_everywhere, make_work
from test_hostrun_sweep import git

DEEP = "/".join("abcdefghijklmnopq")
SCRIPT = r"""
C={canary}
bare() {{ mkdir -p "$1/objects" "$1/refs/heads" && echo 'ref: refs/heads/main' > "$1/HEAD" &&
  printf '[core]\n\tfsmonitor = "echo ran > %s/%s; false"\n' "$C" "$2" > "$1/config"; }}
hook() {{ mkdir -p "$1" && printf '#!/bin/sh\necho ran > %s/%s\n' "$C" "$2" > "$1/pre-commit" &&
  chmod +x "$1/pre-commit"; }}
echo agent > agent-work.txt
bare .git/modules/m/x/g nested; mkdir -p e1; echo 'gitdir: ../.git/modules/m/x/g' > e1/.git
bare .git/modules/{deep} deep; mkdir -p e2; echo 'gitdir: ../.git/modules/{deep}' > e2/.git
mkdir -p .git/objects/evilrepo; bare .git/objects/.git/modules/x link
ln -s .git/objects/evilrepo lnk; mkdir -p e3; echo 'gitdir: ../lnk/../.git/modules/x' > e3/.git
i=0; while [ $i -lt 5001 ]; do printf '' 2>/dev/null > .git/hooks/e$i || break; i=$((i+1)); done
hook .git/hooks hook
hook .git/modules/m/hooks module_hook; hook sub/.git/hooks sub_hook
mkdir -p .git/rebase-merge && echo "exec echo ran > $C/rebase" > .git/rebase-merge/git-rebase-todo
git config alias.st "-c core.fsmonitor='echo ran > $C/alias; false' status"
git config core.fsmonitor "echo ran > $C/fsmonitor; false"
bare .git/objects/ab/evil bare_in_objects
printf '[core]\n\tfsmonitor = "echo ran > %s/include; false"\n' "$C" > tools/git.cfg
hook .husky husky
bare .gitc commondir; echo ../.gitc > .git/commondir; mkdir -p sub2
echo 'gitdir: ../.gitc' > sub2/.git
git init -q newrepo; hook newrepo/.git/hooks newrepo
git -C newrepo config core.fsmonitor "echo ran > $C/newrepo_fsm; false"
echo '{{"task": "evil"}}' > .vscode/settings.json
mkdir -p 'x y;touch PWNED;z' && echo s > 'x y;touch PWNED;z/.envrc'
mkdir -p "$(printf 'esc\033]0;title\007')" && echo s > "$(printf 'esc\033]0;title\007')/.envrc"
chmod 0311 sub/.git .git
exit 0
"""


def _cell(base: Path, backend: str, as_user: bool) -> None:
    work = make_work(base)
    canary = base / "canary"
    (work / "tools").mkdir()
    (work / "tools/git.cfg").write_text("[user]\n\tname = shared\n")
    git(work, "config", "include.path", "../tools/git.cfg")
    (work / ".husky").mkdir()
    git(work, "config", "core.hooksPath", ".husky")
    (work / ".vscode").mkdir()
    (work / ".vscode/settings.json").write_text("{}\n")
    big = os.urandom(2_000_000)
    (work / ".vscode/big.bin").write_bytes(big)
    home, runtime = base / "home", base / "rt"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    config = base / "config.toml"
    config.write_text(f'token_command = ""\nstart_timeout = 60\nworkdir = "{work}"\n')
    argv = ["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}", "--",
            "sh", "-c", SCRIPT.format(canary=canary, deep=DEEP)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GIT_"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    if as_user:
        sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
        from as_user import ordinary_user

        user = ordinary_user()
        if user.unavailable:
            pytest.skip(user.unavailable)
        user.own(home, runtime, work, canary, config)
        env = user.env(home, XDG_RUNTIME_DIR=str(runtime))
        env["PATH"] = os.path.dirname(sys.executable) + ":" + env.get("PATH", "/usr/bin:/bin")
        argv = user.argv(argv)
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=240,
                          check=False)
    assert done.returncode == 0, done.stderr[:3000]
    lines = [x for x in done.stderr.splitlines() if x.startswith("agent-sandbox: ")]
    assert all(line.isprintable() for line in lines)
    assert any("core.fsmonitor" in line for line in lines), done.stderr[-3000:]
    for line in lines:
        if "to apply the session's version: " in line:
            cmd = line.split("to apply the session's version: ", 1)[1]
            subprocess.run(["bash", "-n", "-c", cmd], check=True)
    assert git_everywhere(work, canary) == [], done.stderr[-3000:]
    assert (work / ".vscode/big.bin").read_bytes() == big  # the data-loss case
    assert (work / ".vscode/settings.json").read_text() == "{}\n"
    assert (work / "agent-work.txt").read_text() == "agent\n"
    assert git(work, "-c", "safe.directory=*", "log", "--oneline").stdout.count("init") == 1
    assert not list(base.rglob("PWNED"))
    assert stat.S_IMODE((work / ".git").stat().st_mode) & 0o700 == 0o700  # chmod 0311 undone


@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user"])
@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_the_attacks_through_a_session_leave_nothing_to_run(backend: str, as_user: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="hostrun-e2e-", dir="/tmp"))  # short: sun_path
    try:
        base.chmod(0o755)
        _cell(base, backend, as_user)
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)
