"""Each limit answers with its status and leaves a log line."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc, start_proxy


@pytest.fixture(scope="module")
def blackhole() -> Iterator[int]:
    """A port whose accept queue is full: connecting to it hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    yield port
    filler.close()
    server.close()


@pytest.fixture(scope="module")
def limited(blackhole: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    log = tmp_path_factory.mktemp("limits") / "proxy.log"
    p = start_proxy(["--idle-timeout", "0.6", "--connect-timeout", "0.6", "--max-conns", "3",
                     "--allow", f"blackhole.test:{blackhole}",
                     "--resolve", "blackhole.test:127.0.0.1"], log=log)
    yield p
    assert p.stop() == 0


def exchange(proxy: ProxyProc, data: bytes, wait: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=wait) as s:
        if data:
            s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_431_for_a_huge_head(limited: ProxyProc) -> None:
    head = b"GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n" + b"X-Big: " + b"a" * 40000
    out = exchange(limited, head + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431")
    assert "head too large" in limited.log_text()


def test_431_for_a_huge_request_line(limited: ProxyProc) -> None:
    out = exchange(limited, b"GET http://x.test/" + b"a" * 9000 + b" HTTP/1.1\r\n")
    assert out.startswith(b"HTTP/1.1 431")
    assert "request line too long" in limited.log_text()


def test_408_for_an_idle_client(limited: ProxyProc) -> None:
    out = exchange(limited, b"")
    assert out.startswith(b"HTTP/1.1 408")
    partial = exchange(limited, b"GET http://x.test/ HTTP/1.1\r\nHost: x")
    assert partial.startswith(b"HTTP/1.1 408")
    assert "limit host=- port=0" in limited.log_text()


def test_504_when_the_upstream_does_not_answer(limited: ProxyProc, blackhole: int) -> None:
    out = exchange(limited, f"CONNECT blackhole.test:{blackhole} HTTP/1.1\r\n"
                            f"Host: blackhole.test:{blackhole}\r\n\r\n".encode())
    assert out.startswith(b"HTTP/1.1 504")
    assert f"host=blackhole.test port={blackhole}" in limited.log_text()


def test_503_over_the_connection_limit(limited: ProxyProc) -> None:
    held = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(3)]
    try:
        time.sleep(0.1)
        out = exchange(limited, b"")
        assert out.startswith(b"HTTP/1.1 503")
        assert "more than 3 connections" in limited.log_text()
    finally:
        for s in held:
            s.close()


def test_log_goes_to_the_file_not_stderr(limited: ProxyProc, tmp_path: Path) -> None:
    assert limited.log_text().count("\n") >= 1
    for line in limited.log_text().splitlines():
        assert " egress-proxy " in line
