"""End to end: the real kubectl reaches a loopback API server only through the egress proxy.

A lab cluster's API server listens on the host's loopback.  After
kubeconfig-proxify, kubectl's connection goes to the egress proxy's SOCKS
listener, which lets it through because the proxy was started with that one
loopback port allowed; with the proxy gone, kubectl cannot reach the server.

egress-proxy logs refusals, not every tunnel, so the proof that kubectl went
through it is the kernel's: the stand-in looks up which process holds the
client end of each connection it serves, and it is always the proxy.  A proxy
whose allow list lacks the port refuses, and that refusal is in its log.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import trustme

VERSION = {
    "major": "1", "minor": "31", "gitVersion": "v1.31.0-standin", "gitCommit": "0" * 40,
    "gitTreeState": "clean", "buildDate": "2024-08-13T00:00:00Z", "goVersion": "go1.22.5",
    "compiler": "gc", "platform": "linux/amd64",
}


class StandInAPI(ThreadingHTTPServer):
    """An HTTPS server on 127.0.0.1 that answers like an API server's /version."""

    daemon_threads = True

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.paths: queue.Queue[str] = queue.Queue()
        self.peer_pids: queue.Queue[int | None] = queue.Queue()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: StandInAPI

    def do_GET(self) -> None:
        self.server.paths.put(self.path)
        self.server.peer_pids.put(_owner_of(self.client_address, self.server.port))
        if self.path.split("?", 1)[0] == "/version":
            status, body = 200, json.dumps(VERSION).encode()
        else:
            status, body = 404, b'{"kind":"Status","status":"Failure","code":404}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _owner_of(peer: tuple[str, int], server_port: int) -> int | None:
    """The pid of the process holding the client end of this connection (we are root)."""
    for conn in psutil.net_connections(kind="tcp4"):
        if conn.laddr and tuple(conn.laddr) == tuple(peer[:2]) and conn.raddr and (
            conn.raddr.port == server_port
        ):
            return conn.pid
    return None


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[StandInAPI, str]]:
    """The stand-in server and the PEM of the CA that signed its certificate."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = StandInAPI(context)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield server, ca.cert_pem.bytes().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class EgressProxy:
    """A running egress-proxy child: its SOCKS URL and everything it logged."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            ["egress-proxy", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.log = ""
        self.socks = self._wait_for_socks()

    def _wait_for_socks(self) -> str:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line.startswith("listening socks5://"):
                return line.split(" ", 1)[1]
        self.stop()
        raise AssertionError(f"egress-proxy exited without a SOCKS listener:\n{self.log}")

    def stop(self) -> str:
        """End the proxy and return its whole stderr log."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.log += err.decode(errors="replace")
        return self.log


def kubeconfig(path: Path, port: int, ca_pem: str) -> None:
    ca = base64.b64encode(ca_pem.encode()).decode()
    path.write_text(
        "apiVersion: v1\nkind: Config\npreferences: {}\n"
        f"clusters:\n- cluster:\n    certificate-authority-data: {ca}\n"
        f"    server: https://127.0.0.1:{port}\n  name: kind-lab\n"
        "contexts:\n- context:\n    cluster: kind-lab\n    user: kind-lab\n  name: kind-lab\n"
        "current-context: kind-lab\n"
        # A token, or kubectl prompts for a username on a server without credentials.
        "users:\n- name: kind-lab\n  user:\n    token: stand-in-token\n"
    )
    path.chmod(0o600)


def kubectl_version(config: Path, home: Path) -> subprocess.CompletedProcess[str]:
    # A bare environment: no proxy variables, and a HOME without the host's ~/.kube,
    # so the kubeconfig's proxy-url alone decides the route.
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(config), "--request-timeout=10s", "version", "-o", "json"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )


def test_kubectl_reaches_the_loopback_api_only_through_the_proxy(
    api: tuple[StandInAPI, str], tmp_path: Path
) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    server, ca_pem = api
    config = tmp_path / "kubeconfig"
    kubeconfig(config, server.port, ca_pem)

    proxy = EgressProxy(
        "--listen", "127.0.0.1:0", "--socks", "127.0.0.1:0",
        "--allow", f"127.0.0.1:{server.port}", "--allow-cidr", "127.0.0.1/32",
    )
    try:
        result = subprocess.run(
            ["kubeconfig-proxify", "--in-place", "--proxy", proxy.socks, str(config)],
            capture_output=True, text=True, timeout=30,
        )
        assert result.returncode == 0, result.stderr
        assert f"proxy-url: {proxy.socks}" in config.read_text()

        through = kubectl_version(config, tmp_path)
        assert through.returncode == 0, through.stderr
        assert json.loads(through.stdout)["serverVersion"]["gitVersion"] == "v1.31.0-standin"
        seen = [server.paths.get(timeout=5)]
        while not server.paths.empty():
            seen.append(server.paths.get())
        assert any(path.startswith("/version") for path in seen), seen
        # Every connection the API server saw came from the egress proxy, not kubectl.
        peers = {server.peer_pids.get() for _ in seen}
        assert peers == {proxy.proc.pid}, (peers, proxy.proc.pid)
    finally:
        proxy.stop()

    # The proxy is gone: the same kubeconfig no longer reaches the server at all.
    down = kubectl_version(config, tmp_path)
    assert down.returncode != 0
    assert server.paths.empty()

    # A proxy whose allow list lacks the port refuses, and its log says so.
    other = EgressProxy(
        "--listen", "127.0.0.1:0", "--socks", "127.0.0.1:0",
        "--allow", "127.0.0.1:1", "--allow-cidr", "127.0.0.1/32",
    )
    try:
        subprocess.run(["kubeconfig-proxify", "--in-place", "--proxy", other.socks, str(config)],
                       check=True, capture_output=True, timeout=30)
        refused = kubectl_version(config, tmp_path)
    finally:
        log = other.stop()
    assert refused.returncode != 0
    assert server.paths.empty()
    assert str(server.port) in log and "blocked-by-allowlist" in log, log
