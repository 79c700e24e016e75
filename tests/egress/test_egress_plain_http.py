"""Absolute-form plain HTTP: forwarded through h11, kept alive, bodies streamed."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc, start_proxy
from egress_upstreams import Upstream, start
from egress_world import require


@pytest.fixture(scope="module")
def plain() -> Iterator[Upstream]:
    server = start("echo", None, None)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def loop_proxy(plain: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    log = tmp_path_factory.mktemp("plain") / "log"
    p = start_proxy(["--allow", f"127.0.0.1:{plain.port}", "--allow-cidr", "127.0.0.1/32"],
                    log=log)
    yield p
    assert p.stop() == 0


def test_get_and_post_are_forwarded(loop_proxy: ProxyProc, plain: Upstream,
                                    tmp_path: Path) -> None:
    require("curl")
    body = tmp_path / "body"
    body.write_bytes(b"q" * (3 << 20))
    base = f"http://127.0.0.1:{plain.port}"
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-x", loop_proxy.http,
         "-H", "Proxy-Authorization: Basic Zm9vOmJhcg==", f"{base}/one", f"{base}/two",
         "--next", "-x", loop_proxy.http, "-H", "Transfer-Encoding: chunked",
         "--data-binary", f"@{body}", f"{base}/three"],
        capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    replies = [json.loads(x) for x in out.stdout.replace("}{", "}\n{").splitlines()]
    assert [r["path"] for r in replies] == ["/one", "/two", "/three"]
    assert replies[2]["body_length"] == 3 << 20
    for record in plain.seen[-3:]:
        names = {k.lower() for k, _ in record["headers"]}
        assert not names & {"proxy-authorization", "proxy-connection"}


def test_keep_alive_and_pipelining_on_one_connection(loop_proxy: ProxyProc,
                                                     plain: Upstream) -> None:
    target = f"http://127.0.0.1:{plain.port}"
    two = (f"GET {target}/p1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
           f"GET {target}/p2 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", loop_proxy.port), timeout=10) as s:
        s.sendall(two.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200") == 2
    assert b'"/p1"' in data and b'"/p2"' in data


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://user@127.0.0.1/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET ftp://127.0.0.1/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT nonsense HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ],
)
def test_bad_targets_get_400(loop_proxy: ProxyProc, head: bytes) -> None:
    with socket.create_connection(("127.0.0.1", loop_proxy.port), timeout=10) as s:
        s.sendall(head)
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 400"), data


def test_host_comes_from_the_target(loop_proxy: ProxyProc, plain: Upstream) -> None:
    with socket.create_connection(("127.0.0.1", loop_proxy.port), timeout=10) as s:
        s.sendall(f"GET http://127.0.0.1:{plain.port}/h HTTP/1.1\r\nHost: internal.vhost\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["host"] == f"127.0.0.1:{plain.port}"
