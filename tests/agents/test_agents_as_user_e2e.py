"""The real CLIs in sessions as an ordinary (non-root) user, on both backends.

As root the sandbox is entered with every privilege to drop; as a user, bwrap
needs unprivileged user namespaces and Landlock runs unprivileged.  The
user's home holds what Codex leaves in ~/.codex (tmp/arg0 links to its own
binary): ``codex --version`` starts, with the copy leaving the links out;
``--agent=codex -- bash -c`` runs as typed with a writable home of its own;
``codex -s workspace-write`` is translated, not refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents_world import AGENTS_BIN, installed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))

from as_user import OrdinaryUser, ordinary_user

BACKENDS = ("bwrap", "nono")
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def user() -> OrdinaryUser:
    found = ordinary_user()
    if found.unavailable:
        pytest.skip(f"no ordinary user here: {found.unavailable}")
    if found.prefix and not found.works(["bwrap", "--ro-bind", "/", "/", "true"]):
        pytest.skip("bwrap cannot make a user namespace as an ordinary user here")
    return found


@pytest.fixture()
def base(user: OrdinaryUser) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="as-user-agents-", dir="/tmp"))
    home, work, rt = root / "home", root / "work", root / "rt"
    for d in (home, work, rt):
        d.mkdir(mode=0o700)
    codex = installed("codex")
    arg0 = home / ".codex" / "tmp" / "arg0-linux" / "codex-arg0AbCd"
    arg0.mkdir(parents=True)
    for name in ("apply_patch", "codex-linux-sandbox"):
        (arg0 / name).symlink_to(os.path.realpath(codex) if codex else "/usr/bin/true")
    (home / ".codex" / "config.toml").write_text("check_for_update_on_startup = false\n")
    (root / "config.toml").write_text(f'workdir = "{work}"\ntoken_command = ""\n'
                                      "start_timeout = 60\n")
    root.chmod(0o755)
    user.own(home, work, rt, root / "config.toml")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run(
    user: OrdinaryUser, base: Path, backend: str, *cmd: str
) -> subprocess.CompletedProcess[str]:
    argv = ["agent-sandbox", "run", f"--sandbox={backend}", f"--config={base / 'config.toml'}",
            *cmd]
    env = user.env(base / "home", XDG_RUNTIME_DIR=str(base / "rt"))
    env["PATH"] = f"{BIN}:{AGENTS_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(user.argv(argv), env=env, cwd=base / "work", capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_codex_as_an_ordinary_user(user: OrdinaryUser, base: Path, backend: str) -> None:
    if installed("codex") is None:
        pytest.skip("codex CLI not installed")
    # The first session's copy is kept for the next ones (agent_reuse): what it plants
    # there (a rule, a link out, a directory closed to its owner) is gone in the next.
    plant = ('mkdir -p "$CODEX_HOME/rules" && echo evil > "$CODEX_HOME/rules/x.rules" && '
             'ln -s /etc/shadow "$CODEX_HOME/shadow" && chmod 0 "$CODEX_HOME/rules" && echo P')
    script = ('echo hi; touch "$HOME/.probe" && echo HOME-OK; echo "CODEX_HOME=$CODEX_HOME"; '
              'ls -A "$CODEX_HOME" | tr "\\n" " "; echo; ')
    done = run(user, base, backend, "--agent=codex", "--", "bash", "-c", script + plant)
    assert done.returncode == 0 and done.stdout.endswith("P\n"), done.stdout + done.stderr
    assert done.stdout.startswith("hi\nHOME-OK\n"), done.stdout + done.stderr
    copy = done.stdout.split("CODEX_HOME=", 1)[1].split("\n")[0]
    assert "/agent-sandbox/agents/codex/" in copy
    done = run(user, base, backend, "--", "codex", "--version")
    assert done.returncode == 0 and done.stdout.startswith("codex-cli"), done.stderr[-2000:]
    done = run(user, base, backend, "--", "codex", "-s", "workspace-write", "--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "codex -s workspace-write: Codex's own sandbox cannot nest" in done.stderr
    done = run(user, base, backend, "--agent=codex", "--", "bash", "-c", script)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = done.stdout.split("\n")[3].split()
    assert "config.toml" in listed and "rules" not in listed and "shadow" not in listed, listed
    # Written back, and kept idle for the next session: none in use.
    idle = sorted((base / "home" / ".local" / "state" / "agent-sandbox" / "agents"
                   / "codex").iterdir())  # the copy, and its record beside it (agent_reuse)
    assert [p.name[:5] for p in idle] == ["idle-", "idle-"] and idle[1].suffix == ".ids"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agent", ["claude", "gemini"])
def test_the_other_agents_start_as_an_ordinary_user(
    user: OrdinaryUser, base: Path, backend: str, agent: str
) -> None:
    if installed(agent) is None:
        pytest.skip(f"{agent} CLI not installed")
    done = run(user, base, backend, "--", agent, "--version")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
