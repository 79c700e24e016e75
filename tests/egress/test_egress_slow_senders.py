"""Slow senders are cut off: one deadline for a whole request head or SOCKS handshake.

With ``--idle-timeout=2`` the head timeout is 2 s.  An HTTP request head must be
whole within it of its first byte (the idle time before that byte does not
count: a kept-alive connection may wait for its next request); a SOCKS5
handshake, greeting and request, within it of the connection's start.  Each
client here sends a byte every 0.3 s, far inside any per-read timeout, and
would never be cut off by one.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest
from egress_proxyproc import ProxyProc, start_proxy

DRIBBLE = 0.3  # seconds between bytes
HEAD = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nX-Pad: " + b"a" * 64 + b"\r\n\r\n"
# Greeting (no auth), then CONNECT to a domain name: 3 + 7 + 20 + 2 bytes.
SOCKS = b"\x05\x01\x00" + b"\x05\x01\x00\x03\x14" + b"slow-sender.denied.x" + b"\x01\xbb"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    log = tmp_path_factory.mktemp("slow") / "proxy.log"
    p = start_proxy(["--idle-timeout", "2"], log=log, socks=True)
    yield p
    assert p.stop() == 0


def dribble(address: tuple[str, int], data: bytes) -> tuple[int, bytes]:
    """Send ``data`` a byte at a time until the proxy closes; bytes sent, bytes got."""
    got = b""
    with socket.create_connection(address, timeout=10) as s:
        for sent in range(len(data)):
            try:
                s.sendall(data[sent : sent + 1])
            except OSError:
                return sent, got
            ready, _, _ = select.select([s], [], [], DRIBBLE)
            while ready:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    return sent + 1, got
                if not chunk:
                    return sent + 1, got
                got += chunk
                ready, _, _ = select.select([s], [], [], 0)
        return len(data), got


def test_a_dribbled_request_head_gets_408(proxy: ProxyProc) -> None:
    sent, got = dribble(("127.0.0.1", proxy.port), HEAD)
    assert sent < len(HEAD), "the proxy waited for the whole dribbled head"
    assert got.startswith(b"HTTP/1.1 408")
    assert b"not complete within 2s" in got
    assert "reason=408 the request head was not complete within 2s" in proxy.log_text()


def test_idle_time_before_the_head_does_not_count(proxy: ProxyProc) -> None:
    # Idle 1.2 s, then a head in four pieces over 1.2 s: 2.4 s from the
    # connection's start, but within 2 s of the head's first byte.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        time.sleep(1.2)
        for piece in (HEAD[:10], HEAD[10:40], HEAD[40:70], HEAD[70:]):
            s.sendall(piece)
            time.sleep(0.4)
        got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 403")


def test_a_dribbled_socks_handshake_is_closed(proxy: ProxyProc) -> None:
    assert proxy.socks is not None
    host, port = proxy.socks.rsplit(":", 1)
    sent, got = dribble((host, int(port)), SOCKS)
    assert sent < len(SOCKS), "the proxy waited for the whole dribbled handshake"
    assert got in (b"", b"\x05\x00")  # at most the method choice: no reply to the request
    assert "limit host=- port=0" in proxy.log_text()
    assert "reason=socks: the handshake was not complete within 2s" in proxy.log_text()


def test_the_proxy_serves_on_after_cutting_them_off(proxy: ProxyProc) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(HEAD)
        assert s.recv(65536).startswith(b"HTTP/1.1 403")
