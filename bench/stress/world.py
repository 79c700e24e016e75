"""The proxy parts' world: a test CA, the stand-in upstreams, a token, and clients.

The upstreams (:mod:`upstream`) run in their own process on 127.0.0.1.  The
proxy reaches them only through ``--resolve NAME:127.0.0.1:PORT`` pins (a pin
is trusted, so the address rules let exactly those through); every other
loopback destination must stay refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import trustme

from stress.common import HERE, Server, start_proxy
from stress.upstream import auth_tag

NAMES = ["github.com", "api.github.com", "other.stress.test"]


@dataclass
class Upstreams:
    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    record: Path
    ca_file: Path

    def records(self) -> list[dict[str, object]]:
        try:
            lines = self.record.read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_upstreams(tmp: Path) -> Upstreams:
    ca = trustme.CA()
    leaf = ca.issue_cert(*NAMES)
    cert, key, ca_file = tmp / "up-cert.pem", tmp / "up-key.pem", tmp / "up-ca.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    record = tmp / "upstream-record.jsonl"
    record.write_text("")
    proc = subprocess.Popen([sys.executable, str(HERE / "upstream.py"), str(cert), str(key),
                             str(record)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("the stand-in upstreams did not start")
    return Upstreams(proc, json.loads(line), record, ca_file)


@dataclass
class Proxy:
    server: Server
    port: int
    socks: int | None
    log: Path
    egress: Path

    @property
    def pid(self) -> int:
        return self.server.pid

    def client_context(self) -> ssl.SSLContext:
        """What a sandboxed client trusts: the proxy's CA from the egress dir."""
        ctx = ssl.create_default_context(cafile=str(self.egress / "ca.pem"))
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def token_file(tmp: Path, token: str) -> Path:
    path = tmp / "token-state"
    path.write_text(f"ok:{token}\n")
    return path


def start_world_proxy(tmp: Path, up: Upstreams, *extra: str, token_command: str | None = None,
                      socks: bool = True, prefix: list[str] | None = None,
                      allow: str = "other.stress.test") -> Proxy:
    """egress-proxy pinned to the stand-ins, with its egress dir and log."""
    egress = tmp / f"egress-{time.monotonic_ns()}"
    args = [f"--egress-dir={egress}", f"--upstream-ca={up.ca_file}",
            f"--allow={allow}"]
    for name in NAMES:
        args.append(f"--resolve={name}:127.0.0.1:{up.ports['tls']}")
    if token_command:
        args.append(f"--token-command={token_command}")
    server, port, socks_port, log = start_proxy(tmp, *args, *extra, socks=socks, prefix=prefix)
    return Proxy(server, port, socks_port, log, egress)


def expected_tag(host: str, token: str) -> str:
    """The /small answer's auth tag when ``token`` was set for ``host``."""
    if host == "github.com":
        pair = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        return auth_tag(f"Basic {pair}")
    return auth_tag(f"Bearer {token}")


# --- clients ---------------------------------------------------------------------


async def read_head(reader: asyncio.StreamReader, limit: float = 10.0) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limit)


def status_of(head: bytes) -> int:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def header(head: bytes, name: str) -> str | None:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


async def connect(port: int, target: str, timeout: float = 10.0,
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A CONNECT through the proxy; the response head (the tunnel if 200)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    try:
        head = await read_head(reader, timeout)
    except (asyncio.IncompleteReadError, ConnectionError):
        head = b""
    return reader, writer, head


async def start_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    ctx: ssl.SSLContext, server_name: str) -> None:
    await asyncio.wait_for(writer.start_tls(ctx, server_hostname=server_name), 10.0)


async def request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes,
                  timeout: float = 10.0) -> tuple[bytes, bytes]:
    """Send a raw request; (response head, body read by Content-Length)."""
    writer.write(raw)
    await writer.drain()
    head = await read_head(reader, timeout)
    length = int(header(head, "content-length") or 0)
    body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    return head, body


def get(host: str, path: str = "/small", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.close()


def env_without_proxy() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.lower().endswith("_proxy"):
            del env[key]
    return env
