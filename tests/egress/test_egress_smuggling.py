"""Request smuggling shapes are refused on both HTTP paths, before routing."""

from __future__ import annotations

import socket
import ssl

import pytest
from egress_proxyproc import ProxyProc
from egress_world import World

ATTACKS = {
    "cl-te": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "dup-cl": b"Content-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
    "cl-list": b"Content-Length: 4, 4\r\n\r\nabcd",
    "obs-fold": b"X-Folded: a\r\n b\r\nContent-Length: 4\r\n\r\nabcd",
    "bare-lf": b"X-A: b\nContent-Length: 4\r\n\r\nabcd",
    "te-list": b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
}


def _read_all(s: socket.socket | ssl.SSLSocket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    return out


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_plain_proxy_refuses(proxy: ProxyProc, name: str) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"POST http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n" + ATTACKS[name])
        out = _read_all(s)
    assert out.split(b" ", 2)[1] in (b"400", b"501"), out


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_intercepted_path_refuses(proxy: ProxyProc, world: World, name: str) -> None:
    before = len(world.api.seen)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(proxy.egress_dir / "ca.pem"))  # type: ignore[operator]
        with ctx.wrap_socket(s, server_hostname="api.github.com") as tls:
            tls.sendall(b"POST /smuggle HTTP/1.1\r\nHost: api.github.com\r\n" + ATTACKS[name])
            out = _read_all(tls)
    assert out.split(b" ", 2)[1] in (b"400", b"501"), out
    assert len(world.api.seen) == before
