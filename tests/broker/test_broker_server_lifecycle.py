"""broker-server's life: socket handling, shutdown, profiles, command lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest


@pytest.fixture
def place():
    base = tempfile.mkdtemp(prefix="brk-life-")
    workdir = os.path.join(base, "work")
    os.mkdir(workdir)
    yield base, workdir, os.path.join(base, "s")
    subprocess.run(["rm", "-rf", base], check=False)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def test_stale_socket_is_replaced_live_one_refused(place, tools) -> None:
    _, workdir, sock = place
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock)
    stale.close()  # the file stays, nobody listens: stale
    proc = tools.start_server("nono", workdir, sock)
    try:
        second = run([tools.server, f"--socket={sock}", f"--workdir={workdir}", "--sandbox=nono"])
        assert second.returncode == 1
        assert "already listening" in second.stderr and "Traceback" not in second.stderr
        assert os.path.exists(sock)  # not stolen
    finally:
        assert tools.stop_server(proc) == 0
    assert not os.path.exists(sock)


def test_a_file_that_is_not_a_socket_is_left_alone(place, tools) -> None:
    _, workdir, sock = place
    with open(sock, "w") as fh:
        fh.write("precious")
    done = run([tools.server, f"--socket={sock}", f"--workdir={workdir}", "--sandbox=bwrap"])
    assert done.returncode == 1 and "not a socket" in done.stderr
    with open(sock) as fh:
        assert fh.read() == "precious"


@pytest.mark.parametrize("backend", ["nono", "bwrap"])
def test_sigterm_ends_commands_and_removes_the_socket(place, tools, backend) -> None:
    _, workdir, sock = place
    proc = tools.start_server(backend, workdir, sock)
    env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
    client = subprocess.Popen(
        [tools.client, "--", "sh", "-c", "echo up; sleep 60"],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert client.stdout is not None and client.stdout.readline() == b"up\n"
    started = time.monotonic()
    assert tools.stop_server(proc) == 0
    assert client.wait(timeout=15) == 128 + signal.SIGKILL
    assert time.monotonic() - started < 10
    assert not os.path.exists(sock)


def test_deny_inside_a_grant_is_refused_by_landlock_enforced_by_bwrap(place, tools) -> None:
    base, workdir, sock = place
    secret_dir = os.path.join(workdir, "secrets")
    os.mkdir(secret_dir)
    with open(os.path.join(secret_dir, "key"), "w") as fh:
        fh.write("deny-me\n")
    profile = os.path.join(base, "profile.json")
    with open(profile, "w") as fh:
        json.dump({"filesystem": {"deny": [secret_dir]}}, fh)
    done = run([tools.server, f"--socket={sock}", f"--workdir={workdir}", "--sandbox=nono",
                f"--profile={profile}"])  # fmt: skip
    assert done.returncode == 1 and "cannot deny" in done.stderr
    proc = tools.start_server("bwrap", workdir, sock, f"--profile={profile}")
    try:
        env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
        seen = run([tools.client, "--", "sh", "-c", "cat secrets/key; ls secrets"],
                   cwd=workdir, env=env)  # fmt: skip
        assert "deny-me" not in seen.stdout
    finally:
        tools.stop_server(proc)


def test_auto_names_its_pick(place, tools) -> None:
    _, workdir, sock = place
    proc = tools.start_server("auto", workdir, sock)
    tools.stop_server(proc)
    assert proc.stderr is not None
    assert "sandbox auto: using" in proc.stderr.read()


def test_env_allow_and_profile_network(place, tools) -> None:
    base, workdir, sock = place
    profile = os.path.join(base, "p.json")
    with open(profile, "w") as fh:
        json.dump({"network": {"mode": "proxy", "port": 1}, "environment": {"allow_vars": ["X"]}},
                  fh)  # fmt: skip
    env = dict(os.environ, X="from-profile", Y="from-flag")
    proc = tools.start_server("nono", workdir, sock, f"--profile={profile}", env=env)
    try:
        cenv = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
        got = run([tools.client, "--", "/usr/bin/env"], cwd=workdir, env=cenv)
        assert sorted(got.stdout.split()) == sorted(["X=from-profile", f"TMPDIR={_tmp(got)}"])
    finally:
        tools.stop_server(proc)
    proc = tools.start_server("nono", workdir, sock, "--env-allow=Y,PATH", env=env)
    try:
        got = run([tools.client, "--", "env"], cwd=workdir, env=cenv)
        assert "Y=from-flag" in got.stdout and "X=" not in got.stdout
    finally:
        tools.stop_server(proc)


def _tmp(done: subprocess.CompletedProcess[str]) -> str:
    return next(v.split("=", 1)[1] for v in done.stdout.split() if v.startswith("TMPDIR="))


@pytest.mark.parametrize(
    ("argv", "code", "where", "text"),
    [
        (["--help"], 0, "stdout", "Usage:"),
        (["--version"], 0, "stdout", "0."),
        (["--bogus"], 2, "stderr", "Usage:"),
        (["--socket=/tmp/x", "--workdir=/nonexistent-dir-xyz"], 1, "stderr", "not a directory"),
        (["--socket=/tmp/x", "--workdir=/tmp", "--sandbox=chroot"], 2, "stderr", "--sandbox"),
        (["--socket=/tmp/x", "--workdir=/tmp", "--sign-key=-x"], 1, "stderr", "starts with '-'"),
        (["--socket=/tmp/x", "--workdir=/tmp", "--sign-key=A\nB"], 1, "stderr", "control char"),
        (["--socket=/tmp/x", "--workdir=/tmp", "--sign-key="], 1, "stderr", "is empty"),
    ],
)
def test_server_command_line(tools, argv, code, where, text) -> None:
    done = run([tools.server, *argv])
    assert done.returncode == code and text in getattr(done, where)
    assert "Traceback" not in done.stderr


def test_bad_profile_is_a_clear_error(place, tools) -> None:
    base, workdir, sock = place
    profile = os.path.join(base, "bad.json")
    for body in ('{"filesystem": {"reed": []}}', "{", '{"network": {"mode": "open"}}',
                 '{"environment": {"allow_vars": ["NONO_X"]}}'):  # fmt: skip
        with open(profile, "w") as fh:
            fh.write(body)
        done = run([tools.server, f"--socket={sock}", f"--workdir={workdir}",
                    f"--profile={profile}"])  # fmt: skip
        assert done.returncode == 1 and "profile" in done.stderr.lower(), body
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["--help"], 0, "Usage:"),
        (["--version"], 0, "0."),
        ([], 2, "Usage:"),
        (["-x", "--", "true"], 2, "Usage:"),
        (["--socket"], 2, "Usage:"),
    ],
)
def test_client_command_line(tools, argv, code, text) -> None:
    done = run([tools.client, *argv])
    assert done.returncode == code and text in (done.stdout + done.stderr)


def test_client_without_a_broker_exits_125(tools) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SANDBOX_BROKER_SOCKET"}
    done = run([tools.client, "--", "true"], env=env)
    assert done.returncode == 125 and "AGENT_SANDBOX_BROKER_SOCKET" in done.stderr
    done = run([tools.client, "--socket=/nonexistent/sock", "--", "true"])
    assert done.returncode == 125 and "does not exist" in done.stderr


@pytest.mark.parametrize("backend", ["nono", "bwrap"])
def test_proxy_mode_reaches_the_proxy_port_only(place, tools, backend) -> None:
    base, workdir, sock = place
    proxy, other = socket.socket(), socket.socket()
    for s in (proxy, other):
        s.bind(("127.0.0.1", 0))
        s.listen()
    proxy_port, other_port = proxy.getsockname()[1], other.getsockname()[1]
    profile = os.path.join(base, "proxy.json")
    with open(profile, "w") as fh:
        json.dump({"network": {"mode": "proxy", "port": proxy_port}}, fh)
    served: list[bytes] = []

    def serve_one() -> None:
        conn, _ = proxy.accept()
        with conn:
            data = conn.recv(100)
            served.append(data)
            conn.sendall(b"proxy says hi " + data)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    code = (
        "import socket,sys\n"
        f"c = socket.create_connection(('127.0.0.1', {proxy_port}), timeout=5)\n"
        "c.sendall(b'ping'); print(c.recv(100).decode())\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {other_port}), timeout=3)\n"
        "    print('other port reached')\n"
        "except OSError:\n"
        "    print('other port refused')\n"
    )
    proc = tools.start_server(backend, workdir, sock, f"--profile={profile}")
    try:
        env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
        done = run([tools.client, "--", sys.executable, "-I", "-S", "-c", code], cwd=workdir,
                   env=env)  # fmt: skip
    finally:
        tools.stop_server(proc)
        proxy.close()
        other.close()
    assert done.stdout.split("\n")[:2] == ["proxy says hi ping", "other port refused"], done.stderr
    assert served == [b"ping"]


def test_on_exit_only_its_own_socket_is_removed(place, tools) -> None:
    _, workdir, sock = place
    first = tools.start_server("bwrap", workdir, sock)
    os.unlink(sock)
    second = tools.start_server("bwrap", workdir, sock)
    try:
        assert tools.stop_server(first) == 0
        assert os.path.exists(sock)  # the second server's socket stays
    finally:
        assert tools.stop_server(second) == 0
    assert not os.path.exists(sock)
    third = tools.start_server("bwrap", workdir, sock)
    os.unlink(sock)
    with open(sock, "w") as fh:
        fh.write("someone else's")
    assert tools.stop_server(third) == 0
    assert os.path.exists(sock)


def test_an_unwritable_audit_log_fails_closed(place, tools) -> None:
    _, workdir, sock = place
    proc = tools.start_server("nono", workdir, sock, "--audit=/dev/full")
    env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
    try:
        first = run([tools.client, "--", "true"], cwd=workdir, env=env)
        second = run([tools.client, "--", "true"], cwd=workdir, env=env)
    finally:
        assert tools.stop_server(proc) == 0
    assert first.returncode == 0  # it ran; its own line is what failed
    assert second.returncode == 125 and "audit log" in second.stderr
    assert proc.stderr is not None and "cannot write the audit log" in proc.stderr.read()


def test_a_killed_servers_private_tmp_is_reclaimed_by_the_next(place, tools) -> None:
    """issue 11 item 4: a SIGKILLed Landlock server leaves its tmp base; the next removes it."""
    base, workdir, sock = place
    tmp = os.path.join(base, "tmp")
    os.mkdir(tmp)
    env = dict(os.environ, TMPDIR=tmp)
    first = tools.start_server("nono", workdir, sock, env=env)
    left = [n for n in os.listdir(tmp) if n.startswith("agent-broker-tmp-")]
    assert left == [f for f in left if f.split("-")[3] == str(first.pid)] and len(left) == 1
    first.kill()
    first.wait()
    assert os.listdir(tmp) == left  # SIGKILL: nothing could clean up
    # A base whose owner pid is alive (another server) and a look-alike are left alone.
    alive = os.path.join(tmp, f"agent-broker-tmp-{os.getpid()}-x")
    os.mkdir(alive)
    os.mkdir(os.path.join(tmp, "agent-broker-tmp-notapid"))
    second = tools.start_server("nono", workdir, sock + "2", env=env)
    try:
        names = sorted(os.listdir(tmp))
        assert left[0] not in names
        assert os.path.basename(alive) in names and "agent-broker-tmp-notapid" in names
        assert any(n.startswith(f"agent-broker-tmp-{second.pid}-") for n in names)
    finally:
        assert tools.stop_server(second) == 0
