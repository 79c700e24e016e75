"""Claude Code's settings, the real CLI: the drop-in changes nothing outside, sessions work.

Each variant we render is tried with the real Claude Code against the
stand-in Messages API, with Read and Bash calls scripted in the prompt:

- the machine-wide drop-in (``agent-sandbox render-settings``, and
  ``policy-hook render --policy=FILE``), installed: Claude Code has no option
  for another managed-settings directory, so each run gets a mount namespace
  (bwrap, as the test's user) where ``/etc/claude-code/managed-settings.d`` holds
  it and the rest of ``/etc`` is the host's;
- on the host, with and without it: the same normal permission flow (a Read
  of ``~/.ssh`` is Claude Code's to allow, and runs; Bash runs);
- in a session on both backends, with and without it: the session's own
  settings (its private config, and under bwrap the session-only managed
  file) hold the file tools to the policy, Bash works with no shell noise,
  and a planted ``disableAllHooks`` in the workdir turns nothing off (bwrap).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents_world import SSH_KEY, Home, need

BACKENDS = ("bwrap", "nono")
MANAGED = "/etc/claude-code/managed-settings.d/agent-sandbox.json"


def installed(argv: list[str], drop_in: Path | None) -> list[str]:
    """``argv`` where ``drop_in`` is installed as the machine-wide managed settings."""
    if drop_in is None:
        return argv
    out = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/etc"]
    for entry in os.scandir("/etc"):
        if entry.name == "claude-code":
            continue
        if entry.is_symlink():
            out += ["--symlink", os.readlink(entry.path), entry.path]
        else:
            out += ["--bind", entry.path, entry.path]
    return [*out, "--ro-bind", str(drop_in), MANAGED, "--remount-ro", "/etc", "--", *argv]


def results(out: str) -> list[str]:
    """The scripted calls' results, in order, from the stand-in's answer."""
    return out.split("RESULT<<", 1)[1].rsplit(">>", 1)[0].split("\n--\n")


def _run(w: Home, argv: list[str], drop_in: Path | None, **env: str) -> str:
    done = subprocess.run(
        installed(argv, drop_in),
        env=w.env(**env),
        cwd=w.workdir,
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "RESULT<<" in done.stdout, done.stdout + done.stderr[-2000:]
    return done.stdout


def render(w: Home, how: str) -> Path | None:
    """The drop-in as a user would make it: ``none``, ``render-settings``, ``policy-hook``."""
    if how == "none":
        return None
    if how == "render-settings":
        argv = ["agent-sandbox", "render-settings", f"--config={w.config()}"]
    else:
        policy = w.root / "policy.json"
        policy.write_text(json.dumps({"home": str(w.home), "write": [str(w.workdir)]}))
        argv = ["policy-hook", "render", f"--policy={policy}"]
    done = subprocess.run(argv, env=w.env(), capture_output=True, text=True, check=True)
    path = w.root / f"drop-in-{how}.json"
    path.write_text(done.stdout)
    return path


def claude(prompt: str) -> list[str]:
    """Bash and Read allowed by the user: only a hook (or a deny rule) can refuse a Read."""
    return ["claude", "-p", "--allowedTools=Bash,Read", prompt]


def read(path: Path | str) -> str:
    return "TOOL<<Read " + json.dumps({"file_path": str(path)}) + ">>"


@pytest.mark.parametrize("how", ["none", "render-settings", "policy-hook"])
def test_on_the_host_the_drop_in_changes_nothing(world: Home, how: str) -> None:
    need("claude")
    w = world
    (w.workdir / "notes.txt").write_text("notes-in-workdir")
    prompt = read(w.home / ".ssh" / "id_rsa") + read(w.workdir / "notes.txt") + "RUN<<echo hi>>"
    out = _run(
        w, claude(prompt), render(w, how), ANTHROPIC_BASE_URL=f"https://127.0.0.1:{w.apis.port}"
    )
    # Outside a session Claude Code's normal permission flow decides: Read is
    # allowed, so the Read of ~/.ssh runs (no hook said no, none failed).
    ssh, notes, bash = results(out)
    assert SSH_KEY in ssh and "notes-in-workdir" in notes, out
    assert bash == "hi", out


def test_control_the_harness_does_install_managed_settings(world: Home) -> None:
    """A managed deny rule in the same place is obeyed: the variants above were loaded."""
    need("claude")
    w = world
    key = w.home / ".ssh" / "id_rsa"
    control = w.root / "control.json"
    control.write_text(json.dumps({"permissions": {"deny": [f"Read(/{key})"]}}))
    base = f"https://127.0.0.1:{w.apis.port}"
    (ssh,) = results(_run(w, claude(read(key)), control, ANTHROPIC_BASE_URL=base))
    assert SSH_KEY not in ssh and "denied" in ssh, ssh


@pytest.mark.parametrize("how", ["none", "render-settings"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_in_a_session_the_hook_holds_and_commands_work(
    world: Home, backend: str, how: str
) -> None:
    need("claude")
    w = world
    (w.workdir / "notes.txt").write_text("notes-in-workdir")
    (w.home / ".bashrc").write_text("echo from-bashrc\n")  # the user's, which stays outside
    drop_in = render(w, how)
    prompt = (
        read(w.home / ".ssh" / "id_rsa")
        + read(w.workdir / "notes.txt")
        + "RUN<<echo bash-ran; broker-client -- echo brokered>>"
    )
    argv = ["agent-sandbox", "run", f"--config={w.config()}", f"--sandbox={backend}", "--"]
    out = _run(w, [*argv, *claude(prompt)], drop_in)
    ssh, notes, bash = results(out)
    assert "denied by the agent-sandbox policy" in ssh and SSH_KEY not in out, ssh
    assert "notes-in-workdir" in notes, notes
    # Commands run (Claude Code's own sandbox is off in a session: nested, it
    # failed every command under Landlock), with no shell start-up noise.
    assert "bash-ran\n" in bash and ".bashrc" not in bash, bash
    # bwrap: the broker's socket (Claude Code's own sandbox no longer blocks it);
    # Landlock: the door, a port named by a variable, which survives Claude Code
    # closing every inherited descriptor when its Bash tool starts a shell.
    assert bash.startswith("bash-ran\nbrokered"), bash


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_disable_all_hooks(world: Home, backend: str) -> None:
    """bwrap: the session's managed file holds the hook; Landlock: only the sandbox holds."""
    need("claude")
    w = world
    (w.workdir / ".claude").mkdir()
    (w.workdir / ".claude" / "settings.local.json").write_text('{"disableAllHooks": true}')
    managed = "/etc/claude-code/managed-settings.d/agent-sandbox.json"
    prompt = read(w.home / ".ssh" / "id_rsa") + f"RUN<<head -c 300 {managed}>>"
    argv = ["agent-sandbox", "run", f"--config={w.config()}", f"--sandbox={backend}", "--"]
    ssh, shown = results(_run(w, [*argv, *claude(prompt)], None))
    assert SSH_KEY not in ssh, ssh
    if backend == "bwrap":
        assert "denied by the agent-sandbox policy" in ssh, ssh
        assert '"enabled": false' in shown and "PreToolUse" in shown, shown
    else:  # Landlock mounts nothing: the copy's hook is off, the Read fails in the sandbox
        assert "denied by the agent-sandbox policy" not in ssh, ssh
        assert "No such file" in shown, shown
