"""Grants that reopen a shut home path are refused at start, through the real launcher.

One case per kind of path (an agent's config, a login file, a shell start
file, git's and ssh's config, home itself, a link into home): the exact line
on stderr and exit 2, before anything starts; ``unsafe_grants`` accepts one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def launch(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True, exist_ok=True)
    (home / "dots").mkdir(exist_ok=True)
    if not (home / ".bashrc").is_symlink():
        (home / ".bashrc").symlink_to(home / "dots" / "bashrc")
    if not (home / "alias").is_symlink():
        (home / "alias").symlink_to(home)
    conf = tmp_path / "c.toml"
    conf.write_text(toml)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "AGENT_SANDBOX", "GIT_"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    (tmp_path / "run").mkdir(exist_ok=True, mode=0o700)
    return subprocess.run(
        ["agent-sandbox", "run", f"--config={conf}", f"--workdir={home / 'project'}", "--",
         "true"], env=env, capture_output=True, text=True, timeout=60, cwd=home / "project")


@pytest.mark.parametrize("toml, line", [
    ('write = ["~/.codex"]\n',
     "write: ~/.codex covers Codex's config directory: a hook or MCP server planted there runs "
     "at its next start on the host; remove it, or add '~/.codex' to unsafe_grants to accept "
     "that"),
    ('read = ["~/.codex/auth.json"]\n',
     "read: ~/.codex/auth.json covers Codex's config directory (its login, auth.json) "
     "(~/.codex): it holds a credential the sandbox must never see; remove it, or add "
     "'~/.codex/auth.json' to unsafe_grants to accept that"),
    ('write = ["~/.bashrc"]\n',
     "write: ~/.bashrc covers a shell start file: a line planted there runs in your next shell;"
     " remove it, or add '~/.bashrc' to unsafe_grants to accept that"),
    ('write = ["~/dots"]\n',  # where ~/.bashrc really is
     "write: ~/dots covers a shell start file (~/.bashrc): a line planted there runs in your "
     "next shell; remove it, or add '~/dots' to unsafe_grants to accept that"),
    ('write = ["~/.config/git"]\n',
     "write: ~/.config/git covers git's global config: a hook path, alias or fsmonitor planted "
     "there runs at your next git command; remove it, or add '~/.config/git' to unsafe_grants "
     "to accept that"),
    ('read = ["~/.ssh"]\n',
     "read: ~/.ssh covers ssh's keys: it holds a credential the sandbox must never see; remove "
     "it, or add '~/.ssh' to unsafe_grants to accept that"),
    ('write = ["~/alias"]\n',  # a link to home
     "write: ~/alias holds your whole home directory, every credential and start file in it; "
     "remove it, or add '~/alias' to unsafe_grants to accept that"),
])
def test_a_reopening_grant_is_refused_with_its_line(tmp_path: Path, toml: str, line: str) -> None:
    done = launch(tmp_path, toml)
    assert done.returncode == 2, done.stderr
    conf = tmp_path / "c.toml"
    assert done.stderr == f"agent-sandbox: {conf} line 1: {line}\n"


def test_unsafe_grants_accepts_a_named_grant(tmp_path: Path) -> None:
    (tmp_path / "home" / ".codex").mkdir(parents=True)
    done = launch(tmp_path, 'write = ["~/.codex"]\nunsafe_grants = ["~/.codex"]\n')
    assert done.returncode == 0, done.stderr
