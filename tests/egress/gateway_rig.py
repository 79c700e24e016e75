"""A gateway egress-proxy with many tenants, and the clients the gateway tests use.

One real ``egress-proxy --control=PATH`` subprocess; tenants added over the
control socket; stand-ins on loopback: a TLS echo for every tenant's secret
host (the proxy verifies it with --upstream-ca), a plain-HTTP echo for the
allow lists, a raw TCP echo for long-lived tunnels.  Clients are real curl
(``--proxy-user``, ``socks5h://user:pass@``) and, for tunnels held open,
plain sockets speaking CONNECT.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egress_proxyproc import ProxyProc
from egress_upstreams import Upstream

from libegress.control import control_request


@dataclass
class TenantKeys:
    name: str
    password: str
    ca: Path
    canary: str
    record: Path


@dataclass
class Gateway:
    tmp: Path
    proxy: ProxyProc
    control: str
    tls: Upstream  # every tenant's secret host
    plain: Upstream  # every tenant's allowed host
    echo_port: int
    tenants: dict[str, TenantKeys] = field(default_factory=dict)

    def request(self, frame: dict[str, Any]) -> dict[str, Any]:
        return control_request(self.control, frame)

    def add(self, name: str, index: int, *, allow_echo: bool = False,
            **more: Any) -> TenantKeys:
        """Tenant ``name``: may reach ok<index>.test and echo.test only; sec<index>.test
        gets its own canary in x-canary."""
        canary = f"CANARY-{name}-{os.urandom(8).hex()}"
        secrets_file = self.tmp / f"{name}.secrets.json"
        secrets_file.write_text(json.dumps([{"host": f"sec{index}.test", "header": "x-canary",
                                             "format": "{}", "command": f"echo {canary}"}]))
        record = self.tmp / f"{name}.record.jsonl"
        allow = [f"ok{index}.test:{self.plain.port}"]
        if allow_echo:
            allow.append(f"echo.test:{self.echo_port}")
        policy = {
            "allow": ",".join(allow), "inject": "", "secrets": str(secrets_file),
            "record": str(record),
            "resolve": [f"ok{index}.test:127.0.0.1", "echo.test:127.0.0.1",
                        f"sec{index}.test:127.0.0.1:{self.tls.port}"],
            **more,
        }
        answer = self.request({"op": "add", "tenant": name, "policy": policy})
        assert answer["ok"], answer
        ca = self.tmp / f"{name}.ca.pem"
        ca.write_text(answer["ca_pem"])
        keys = TenantKeys(name, answer["password"], ca, canary, record)
        self.tenants[name] = keys
        return keys


def curl(gw: Gateway, url: str, *extra: str, user: str | None = None,
         socks: bool = False) -> subprocess.CompletedProcess[str]:
    """curl ``url`` through the gateway; stdout ends with ``code=HTTP CONNECT=HTTP``."""
    if socks:
        assert gw.proxy.socks is not None
        proxy = f"socks5h://{user + '@' if user else ''}{gw.proxy.socks}"
        argv = ["curl", "-sS", "--max-time", "20", "-x", proxy]
    else:
        argv = ["curl", "-sS", "--max-time", "20", "-x", gw.proxy.http]
        if user:
            argv += ["--proxy-user", user]
    argv += [*extra, "-w", "\ncode=%{http_code} connect=%{http_connect}", url]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(argv, capture_output=True, text=True, timeout=40, env=env,
                          check=False)


def codes(done: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    last = done.stdout.rsplit("\n", 1)[-1]
    parts = dict(p.split("=", 1) for p in last.split())
    return parts["code"], parts["connect"]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def open_tunnel(gw: Gateway, user: str, password: str) -> tuple[socket.socket, bytes]:
    """A CONNECT tunnel to echo.test through the gateway; the socket and the status line."""
    sock = socket.create_connection(("127.0.0.1", gw.proxy.port), timeout=10)
    target = f"echo.test:{gw.echo_port}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                 f"Proxy-Authorization: {basic(user, password)}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head.split(b"\r\n", 1)[0]


def echo_once(sock: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` and read as many bytes back (fewer if the tunnel ends)."""
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def start_echo() -> tuple[socket.socket, int]:
    """A TCP echo server on 127.0.0.1 (daemon threads); its listener and port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]
