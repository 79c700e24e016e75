"""egress-proxy's command line: help, version, usage errors, signals, peers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_proxyproc import start_proxy
from egress_world import TOKEN, World, require


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["egress-proxy", *args], capture_output=True, text=True, check=False,
                          timeout=30)


def test_help_and_version() -> None:
    assert run("--help").returncode == 0
    assert "--listen=HOST:PORT" in run("--help").stdout
    assert run("--version").returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--listen", "nonsense"],
        ["--listen", "127.0.0.1:0", "--allow", "ex*ample.com"],
        ["--listen", "127.0.0.1:0", "--allow-cidr", "10.0.0.0/33"],
        ["--listen", "127.0.0.1:0", "--resolve", "github.com"],
        ["--listen", "127.0.0.1:0", "--resolve", "github.com:not-an-ip"],
        ["--listen", "127.0.0.1:0", "--token-command", "echo 'unbalanced"],
        ["--listen", "127.0.0.1:0", "--token-every", "-1"],
        ["--listen", "127.0.0.1:0", "--upstream-ca", "/nonexistent.pem"],
        ["--listen", "127.0.0.1:0", "--bogus"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr


def test_bind_failure_exits_1() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = run("--listen", f"127.0.0.1:{port}")
    assert out.returncode == 1
    assert out.stderr.startswith("egress-proxy: cannot listen")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_open_tunnels_and_exits_0(world: World, sig: int) -> None:
    p = start_proxy(["--allow", f"allowed.test:{world.plain.port}", "--resolve",
                     "allowed.test:127.0.0.1"], socks=True)
    tunnel = socket.create_connection(("127.0.0.1", p.port))
    tunnel.sendall(f"CONNECT allowed.test:{world.plain.port} HTTP/1.1\r\n"
                   f"Host: allowed.test\r\n\r\n".encode())
    assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
    p.proc.send_signal(sig)
    assert p.proc.wait(10) == 0
    tunnel.settimeout(5)
    assert tunnel.recv(10) == b""
    tunnel.close()


def test_socks_with_numeric_allow_and_cidr(tmp_path: Path) -> None:
    # The kubectl shape: --allow 127.0.0.1:PORT --allow-cidr 127.0.0.1/32.
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            conn.recv(4096)

    threading.Thread(target=answer, daemon=True).start()
    p = start_proxy(["--allow", f"127.0.0.1:{port}", "--allow-cidr", "127.0.0.1/32"], socks=True)
    try:
        ok = subprocess.run(["curl", "-sS", "--max-time", "10", "--socks5", str(p.socks),
                             f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                            check=False)
        assert ok.stdout == "hello", ok.stderr
        other = subprocess.run(["curl", "-sS", "--max-time", "10", "--socks5", str(p.socks),
                                f"http://127.0.0.1:{port + 1 if port < 65535 else 1}/"],
                               capture_output=True, text=True, check=False)
        assert other.returncode == 97
    finally:
        assert p.stop() == 0
        server.close()


def test_peer_of_another_uid_is_refused(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to act as another user")
    require("curl")
    log = tmp_path / "log"
    p = start_proxy(["--allow", "example.test"], log=log, socks=True)
    try:
        as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        http = subprocess.run([*as_nobody, "curl", "-sS", "-i", "--max-time", "5", "-x", p.http,
                               "http://example.test/"], capture_output=True, text=True,
                              check=False)
        assert "HTTP/1.1" not in http.stdout
        socks = subprocess.run([*as_nobody, "curl", "-sS", "--max-time", "5", "--socks5-hostname",
                                str(p.socks), "http://example.test/"], capture_output=True,
                               text=True, check=False)
        assert socks.returncode != 0
        assert log.read_text().count("peer owned by uid 65534") == 2
    finally:
        assert p.stop() == 0


def test_token_never_in_error_bodies_or_logs(world: World, tmp_path: Path) -> None:
    # A proxy whose upstream TLS fails (no --upstream-ca): the error body and log
    # line name the failure, never the token.
    log = tmp_path / "log"
    p = start_proxy(["--resolve", f"api.github.com:127.0.0.1:{world.api.port}",
                     "--token-command", f"cat {world.token_file}", "--egress-dir",
                     str(tmp_path / "egress")], log=log)
    try:
        out = subprocess.run(["curl", "-sS", "-i", "--max-time", "10", "-x", p.http, "--cacert",
                              str(tmp_path / "egress" / "bundle.pem"),
                              "https://api.github.com/x"], capture_output=True, text=True,
                             check=False)
        assert "HTTP/1.1 502" in out.stdout
        assert TOKEN not in out.stdout + out.stderr
    finally:
        assert p.stop() == 0
    text = log.read_text()
    # The server it reached is named: a certificate that does not verify is most often
    # the wrong server's.
    assert f"TLS with api.github.com at 127.0.0.1 port {world.api.port} failed" in text
    assert TOKEN not in text
    for f in (tmp_path / "egress").rglob("*"):
        if f.is_file():
            assert TOKEN not in f.read_text()
    assert json.dumps(world.api.seen).count(TOKEN) == sum(
        1 for r in world.api.seen for k, v in r["headers"] if k.lower() == "authorization")


@pytest.fixture
def hosts_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n10.1.2.3 internal.test\n127.0.0.1 sneaky.test\n"
                    "169.254.169.254 metadata.test\n::ffff:127.0.0.1 mapped.test\n")
    yield path


def test_names_resolving_to_non_public_addresses_are_refused(hosts_file: Path,
                                                             tmp_path: Path) -> None:
    # The proxy runs with its own /etc/hosts (a private mount namespace, same
    # network), so the real resolver path answers and no DNS query leaves the machine.
    unshare = require("unshare")
    require("curl")
    if os.getuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    log = tmp_path / "log"
    prefix = [unshare, "--mount", "--propagation", "private", "sh", "-c",
              'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file)]
    p = start_proxy(["--allow", "internal.test,sneaky.test,metadata.test,mapped.test,localhost"],
                    log=log, socks=True, prefix=prefix)
    try:
        for host in ("internal.test", "sneaky.test", "metadata.test", "mapped.test", "localhost"):
            out = subprocess.run(["curl", "-sS", "-i", "--max-time", "10", "-x", p.http,
                                  f"http://{host}/"], capture_output=True, text=True, check=False)
            assert out.stdout.startswith("HTTP/1.1 403"), (host, out)
            assert "X-Proxy-Error: blocked-address" in out.stdout
            assert host in out.stdout.split("\n\n", 1)[1]
            socks = subprocess.run(["curl", "-sS", "--max-time", "10", "--socks5-hostname",
                                    str(p.socks), f"http://{host}/"], capture_output=True,
                                   text=True, check=False)
            assert socks.returncode == 97
    finally:
        assert p.stop() == 0
    assert "host=internal.test port=80" in log.read_text()
    assert "RFC 1918" in log.read_text()


def test_sigterm_during_the_first_token_read_exits_0(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    slow = f"sh -c 'touch {marker}; exec sleep 30'"
    proc = subprocess.Popen(["egress-proxy", "--listen", "127.0.0.1:0", "--token-command", slow],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert proc.stdout is not None and proc.stdout.read() == b""
    left = subprocess.run(["pgrep", "-f", f"touch {marker}"], capture_output=True, check=False)
    assert left.stdout == b""


def test_failing_token_command_still_serves_without_a_token(world: World, tmp_path: Path) -> None:
    log = tmp_path / "log"
    p = start_proxy(["--resolve", f"api.github.com:127.0.0.1:{world.api.port}", "--upstream-ca",
                     str(world.ca_file), "--token-command", "false", "--egress-dir",
                     str(tmp_path / "egress")], log=log)
    try:
        out = subprocess.run(["curl", "-sS", "--max-time", "10", "-x", p.http, "--cacert",
                              str(tmp_path / "egress" / "bundle.pem"), "-H",
                              "Authorization: token forged", "https://api.github.com/none"],
                             capture_output=True, text=True, check=False)
        assert json.loads(out.stdout)["authorization"] == []
    finally:
        assert p.stop() == 0
    assert "token renewal failed: the token command exited with status 1; no token is held" in (
        log.read_text())


def test_wrong_token_early_401_ends_the_exchange(world: World, tmp_path: Path) -> None:
    # The stand-in answers 401 without reading the body: the proxy relays the
    # answer and ends the connection instead of waiting for the rest.
    p = start_proxy(["--resolve", f"github.com:127.0.0.1:{world.git.port}", "--upstream-ca",
                     str(world.ca_file), "--token-command", "echo wrong-token", "--egress-dir",
                     str(tmp_path / "egress")], log=tmp_path / "log")
    body = tmp_path / "body"
    body.write_bytes(b"0" * (8 << 20))
    try:
        out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                              "--max-time", "30", "-x", p.http, "--cacert",
                              str(tmp_path / "egress" / "bundle.pem"), "-H",
                              "Expect: 100-continue", "--data-binary", f"@{body}",
                              "https://github.com/repo.git/git-receive-pack"],
                             capture_output=True, text=True, check=False, timeout=60)
        assert out.stdout == "401", out.stderr
    finally:
        assert p.stop() == 0


@pytest.mark.parametrize("argv", [
    ["--listen-fd=4", "--socks-fd=5", "--allow=github.com,*.npmjs.org", "--inject=github.com",
     "--egress-dir=/run/x/egress", "--token-every=300"],
    ["--listen=127.0.0.1:0", "--socks=127.0.0.1:0", "--allow=a.com",
     "--token-command=gh auth token",
     "--resolve=a.com:10.0.0.1", "--resolve=b.com:10.0.0.2:8443", "--allow-cidr=10.0.0.0/8",
     "--upstream-ca=/etc/ca.pem", "--secrets=/run/x/secrets.json", "--repos=o/r,o/s",
     "--record=/run/x/record", "--learn", "--log=/tmp/l", "--log-allowed", "--token-timeout=5",
     "--idle-timeout=9", "--connect-timeout=3", "--max-conns=7"],
    ["--listen-fd=4"],
    ["--listen=127.0.0.1:0", "--control=/run/x/control.sock"],
])
def test_the_quick_parse_is_docopts(argv: list[str]) -> None:
    """A session's usual command line skips docopt (its import and parse): the same dict."""
    import bin.egress_proxy as egress_proxy
    from libbroker.cli import parse

    assert egress_proxy.quick_args(argv) == parse(egress_proxy.__doc__ or "", argv)


@pytest.mark.parametrize("argv", [
    [], ["--allow=a.com"], ["--listen-fd=4", "--listen=127.0.0.1:0"],
    ["--listen-fd=4", "--socks-fd=5", "--socks=127.0.0.1:0"], ["--listen-fd", "4"],
    ["--listen-fd=4", "--allow="], ["--listen-fd=4", "--allow=a", "--allow=b"],
    ["--listen-fd=4", "--learn", "--learn"], ["--listen-fd=4", "--lea"], ["--listen-fd=4", "-h"],
    ["--listen-fd=4", "--version"], ["--listen-fd=4", "--learn=yes"], ["--listen-fd=4", "x"],
])
def test_anything_else_is_left_to_docopt(argv: list[str]) -> None:
    import bin.egress_proxy as egress_proxy

    assert egress_proxy.quick_args(argv) is None
