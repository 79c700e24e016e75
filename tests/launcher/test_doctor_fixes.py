"""doctor: a screenful by default, every check with --verbose, and fixes that work as pasted.

A fix's commands are between backticks.  In a fresh HOME with the three
agents on PATH, doctor suggests making each agent's config; each suggested
command is run as printed (``sh -c``, that HOME) and doctor run again: the
check it fixes is ok.  The machine-wide drop-in's fix is run the same way
against a drop-in path in a temp dir (``sudo`` dropped: the tests run as root).
Fixes that change the machine (apt-get, sysctl, a rebuild of the native
helpers) are not run here; their checks pass on the test machines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libbroker.launcher import doctor, doctor_agents, settings
from libbroker.launcher.config import HostFacts
from libbroker.launcher.config_file import load

AGENTS = ("claude", "codex", "gemini")
MACHINE_WIDE = ("apt-get ", "sysctl ", "sudo ")


def _world(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    home, work, bin_dir = tmp_path / "home", tmp_path / "work", tmp_path / "bin"
    for d in (home, work, bin_dir):
        d.mkdir()
    for name in AGENTS:  # stand-ins: doctor only looks them up on PATH
        script = bin_dir / name
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "AGENT_SANDBOX"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}:{env['PATH']}",
               XDG_RUNTIME_DIR=str(tmp_path))
    return home, work, env


def _doctor(work: Path, env: dict[str, str], *flags: str) -> list[str]:
    done = subprocess.run(["agent-sandbox", "doctor", *flags], capture_output=True, text=True,
                          env=env, cwd=work, timeout=120, check=False)
    assert done.returncode in (0, 1) and done.stderr == "", done.stderr
    return done.stdout.splitlines()


def _commands(line: str) -> list[str]:
    return re.findall(r"`([^`]+)`", line.partition(" -- fix: ")[2])


def test_the_default_fits_a_screen_and_verbose_has_every_check(tmp_path: Path) -> None:
    _, work, env = _world(tmp_path)
    short = _doctor(work, env)
    full = _doctor(work, env, "--verbose")
    assert len(short) <= 15, "\n".join(short)
    assert short[-1] in ("a session can run here", "no session can run here yet")
    assert not any("git-hooks" in line for line in short)  # the host-run list: --verbose
    assert any(line.startswith("ok     hooks/") and "git-hooks" in line for line in full)
    for name in ("egress-proxy", "broker-server", "policy-hook"):
        assert any(line.startswith(f"ok   {name}: installed") for line in full)
    assert any(line.startswith("ok   executables installed: egress-proxy, broker-server")
               for line in short), short
    # Every not-ok finding is in both, whole.
    assert [x for x in short if not x.startswith("ok ")] == [
        x for x in full if not x.startswith("ok ")]


def test_each_agent_fix_as_printed_turns_its_check_ok(tmp_path: Path) -> None:
    home, work, env = _world(tmp_path)
    before = _doctor(work, env, "--verbose")
    fixed = []
    for name in AGENTS:
        line = next(x for x in before if x.startswith(f"warn agent {name} "))
        commands = _commands(line)
        assert commands and "mkdir ~/.claude.json" not in line, line
        for command in commands:
            assert not command.startswith(MACHINE_WIDE), command
            done = subprocess.run(["sh", "-c", command], env=env, cwd=work, timeout=30,
                                  check=False, capture_output=True, text=True)
            assert done.returncode == 0, (command, done.stderr)
        fixed.append(name)
    after = _doctor(work, env, "--verbose")
    for name in fixed:
        line = next(x for x in after if x.startswith(("ok   agent " + name, "warn agent " + name)))
        assert line.startswith(f"ok   agent {name} "), line
    assert json.loads((home / ".claude.json").read_text()) == {}  # a file, as Claude Code wants
    assert (home / ".claude").is_dir() and (home / ".codex").is_dir()
    assert any(x.startswith("ok   agents ready: claude") for x in _doctor(work, env))


def test_the_drop_in_fix_as_printed_turns_its_check_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, work, env = _world(tmp_path)
    target = tmp_path / "managed-settings.d" / "agent-sandbox.json"
    monkeypatch.setattr(settings, "target_path", lambda: str(target))
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
    # The drop-in names the interpreter: here, the one agent-sandbox runs under.
    script = shutil.which("agent-sandbox")
    assert script is not None
    monkeypatch.setattr(sys, "executable", Path(script).read_text().splitlines()[0][2:])
    cfg = load(None, HostFacts(home=str(home), cwd=str(work), gh_present=False))
    target.parent.mkdir()
    target.write_text(json.dumps({"sandbox": {"enabled": True}}))  # an old one
    check = doctor_agents.check_claude_managed(cfg)
    assert check.level == doctor.WARN
    install, remove = _commands(check.line())
    assert install.startswith("agent-sandbox render-settings | sudo install")
    assert remove.startswith("sudo rm ")
    done = subprocess.run(["sh", "-c", install.replace("sudo ", "")], env=env, cwd=work,
                          timeout=60, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert doctor_agents.check_claude_managed(cfg).level == doctor.OK
    subprocess.run(["sh", "-c", remove.replace("sudo ", "")], check=True, timeout=30)
    assert not target.exists()
