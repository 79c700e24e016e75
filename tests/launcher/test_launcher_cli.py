"""agent-sandbox's command line: help, usage errors, doctor, render-settings,
the bridge's pump, and the kubeconfig a session gets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from launcher_world import World

from libbroker.sandbox.bridge import pump


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["agent-sandbox", *args], capture_output=True, text=True, env=env, check=False, timeout=120
    )


def test_help_and_version_exit_0() -> None:
    assert _cli("--help").returncode == 0
    done = _cli("--version")
    assert done.returncode == 0 and done.stdout.strip()


def test_usage_errors_exit_2_with_the_usage() -> None:
    done = _cli("run")
    assert done.returncode == 2
    assert "run: no command given" in done.stderr
    done = _cli("frobnicate")
    assert done.returncode == 2
    assert "Usage:" in done.stderr


def test_a_bad_sandbox_kind_exits_2(world: World) -> None:
    done = _cli("run", "--sandbox=docker", "--", "true", env=world.env())
    assert done.returncode == 2
    assert world.leftovers() == []  # the servers started early are gone too
    assert "--sandbox: must be one of" in done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_reports_one_line_per_check_and_passes_here(world: World) -> None:
    done = _cli("doctor", "--verbose", f"--config={world.config()}", env=world.env())
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(line.startswith("ok   bwrap") for line in lines), lines
    assert any("token: the token command prints a token" in line for line in lines)
    assert not any(line.startswith("warn managed settings") for line in lines)  # per session now
    assert "tok123" not in done.stdout + done.stderr
    from libbroker.native import built

    for name in ("gpg-shim", "reaper", "forwarder"):  # C helpers: built by just setup, else a fix
        line = next(line for line in lines if f"native {name}:" in line)
        assert line.startswith("ok   ") if built(name) else "-m libbroker.native`" in line


def test_doctor_fails_without_a_usable_workdir(world: World, tmp_path: Path) -> None:
    config = world.config(workdir=str(tmp_path / "missing"))
    done = _cli("doctor", f"--config={config}", env=world.env())
    assert done.returncode == 1
    assert "FAIL workdir" in done.stdout


def test_render_settings_prints_the_drop_in_and_how_to_install_it(world: World) -> None:
    done = _cli("render-settings", f"--config={world.config()}", env=world.env())
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)
    # Machine-wide, so inert outside sessions: Claude Code's own sandbox left
    # as the user has it, a hook that acts only in a session, nothing else.
    assert set(settings) == {"sandbox", "hooks"}
    assert "enabled" not in settings["sandbox"]
    command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert command.startswith('[ -z "${AGENT_SANDBOX+x}${AGENT_SANDBOX_POLICY+x}" ] && exit 0;')
    assert "managed-settings.d" in done.stderr and "install" in done.stderr


def test_pump_relays_both_ways_and_half_closes() -> None:
    a_out, a_in = socket.socketpair()
    b_in, b_out = socket.socketpair()
    pump(a_in, b_in)
    payload = os.urandom(1 << 20)
    sender = threading.Thread(target=lambda: (a_out.sendall(payload), a_out.shutdown(1)))
    sender.start()
    got = bytearray()
    while chunk := b_out.recv(1 << 16):
        got += chunk
    sender.join()
    assert bytes(got) == payload
    b_out.sendall(b"reply")
    b_out.shutdown(socket.SHUT_WR)
    back = bytearray()
    while chunk := a_out.recv(1 << 16):
        back += chunk
    assert bytes(back) == b"reply"


def test_a_lab_kubeconfig_is_proxified_for_the_session(world: World) -> None:
    kube = world.root / "lab.kubeconfig"
    kube.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n"
        "- name: kind-lab\n  cluster:\n    server: https://127.0.0.1:6443\n"
        "- name: remote\n  cluster:\n    server: https://k8s.example.com\n"
        "contexts: []\nusers: []\n"
    )
    config = world.config(kubeconfig=str(kube))
    done = world.run("sh", "-c", 'echo "KUBECONFIG=$KUBECONFIG"; cat "$KUBECONFIG"', config=config)
    assert done.returncode == 0, done.stderr
    assert "KUBECONFIG=" in done.stdout and "/kubeconfig" in done.stdout
    assert "proxy-url: socks5://127.0.0.1:1080" in done.stdout
    assert done.stdout.count("proxy-url") == 1
    assert "proxy-url" not in kube.read_text()  # the user's file is untouched
    assert world.leftovers() == []


def test_the_launcher_process_imports_nothing_heavy(world: World) -> None:
    script = (
        "import os, sys\n"
        "sys.argv = ['agent-sandbox', 'run', sys.argv[1], '--', 'true']\n"
        "real_exit = os._exit\n"
        "def report(code):\n"
        "    heavy = {'cryptography', 'psutil', 'nono_py', 'yaml', 'h11', 'asyncio'}\n"
        "    print('heavy:', sorted(heavy & set(sys.modules)), flush=True)\n"
        "    real_exit(code)\n"
        "os._exit = report\n"
        "from bin.agent_sandbox import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, f"--config={world.config()}"],
        capture_output=True,
        text=True,
        env=world.env(),
        cwd=str(world.workdir),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stdout


def test_doctor_judges_a_machine_wide_drop_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None: fine (optional). An old one (sandbox on, or a hook that runs outside
    sessions): a warning with the fix. The current rendering: fine."""
    from libbroker.launcher import doctor, doctor_agents, settings
    from libbroker.launcher.config import Config

    target = tmp_path / "agent-sandbox.json"
    monkeypatch.setattr(settings, "target_path", lambda: str(target))
    cfg = Config(workdir=str(tmp_path), home=str(tmp_path), harness=str(tmp_path / ".claude"))
    assert doctor_agents.check_claude_managed(cfg).level == doctor.OK
    current = json.loads(settings.render(cfg))
    old_hook = current["hooks"]["PreToolUse"][0]["hooks"][0]["command"].split("; ", 1)[1]
    for old in ({**current, "sandbox": {"enabled": True}},
                {"hooks": {"PreToolUse": [{"matcher": "x", "hooks": [
                    {"type": "command", "command": old_hook}]}]}}):
        target.write_text(json.dumps(old))
        check = doctor_agents.check_claude_managed(cfg)
        assert check.level == doctor.WARN and "render-settings" in check.fix, check
    target.write_text(settings.render(cfg))
    assert doctor_agents.check_claude_managed(cfg).level == doctor.OK


def test_a_shell_left_on_a_detached_bind_is_put_back_by_pwd(world: World) -> None:
    # A shell that entered the workdir while a session's live gate had it bound
    # onto itself stands on a detached mount once the bind goes: getcwd fails
    # (ENOENT) though the same directory is there by its path.  The launcher
    # steps onto $PWD (same inode) as `cd "$PWD"` would, instead of an internal error.
    wd = str(world.workdir)
    subprocess.run(["mount", "--bind", wd, wd], check=True)
    try:
        shell = subprocess.Popen(
            ["sh", "-c", f'cd "$1" && echo in && read go && exec agent-sandbox run '
                         f'--config={world.config()} -- pwd', "sh", wd],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=world.env())
        assert shell.stdout is not None and shell.stdout.readline() == "in\n"
    finally:
        subprocess.run(["umount", "-l", wd], check=True)
    out, err = shell.communicate("go\n", timeout=90)
    assert shell.returncode == 0, err
    assert out.splitlines()[-1] == wd


def test_a_removed_current_directory_is_one_clear_line(world: World, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    done = subprocess.run(
        ["sh", "-c", f'mkdir "$1" && cd "$1" && rmdir "$1" && exec agent-sandbox run '
                     f'--config={world.config()} -- true', "sh", str(gone)],
        capture_output=True, text=True, env=world.env(), check=False, timeout=90)
    assert done.returncode == 2, done.stderr  # a configuration error
    assert done.stderr.splitlines() == [
        "agent-sandbox: the current directory was removed, or can no longer be reached by its "
        'path: cd to the directory you mean (cd "$PWD" if it is still there) and run again']
    assert world.leftovers() == []
