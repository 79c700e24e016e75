"""Hostile bytes on both listeners: answered or dropped, never an internal error."""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc, start_proxy

SEEDS = [
    b"CONNECT github.com:443 HTTP/1.1\r\nHost: github.com\r\n\r\n\x16\x03\x01garbage",
    b"GET http://[::1]:80/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x05\x01\x00\x05\x01\x00\x03\xffaaaa",
    b"\x05\x02\x00\x01\x05\x01\x00\x04" + bytes(16) + b"\x00\x50",
    b"\x05\x01\x00\x05\x01\x00\x03\x00\x00\x50",
    b"\x00" * 64,
]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    log = tmp_path_factory.mktemp("garbage") / "log"
    # a.test is pinned to a closed loopback port: nothing here asks DNS.
    p = start_proxy(["--allow", "a.test,a.test:9", "--resolve", "a.test:127.0.0.1:9",
                     "--idle-timeout", "1"], log=log, socks=True)
    yield p
    assert p.stop() == 0


def _poke(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass


def test_mutated_inputs(target: ProxyProc) -> None:
    rng = random.Random(1234)
    socks_port = int(str(target.socks).rsplit(":", 1)[1])
    for i in range(150):
        seed = bytearray(rng.choice(SEEDS))
        for _ in range(rng.randint(0, 4)):
            seed[rng.randrange(len(seed))] = rng.randrange(256)
        _poke(target.port if i % 2 else socks_port, bytes(seed[: rng.randint(1, len(seed))]))
    assert "internal error" not in target.log_text()
    out = subprocess.run(["curl", "-sS", "-i", "--max-time", "5", "-x", target.http,
                          "http://denied.test/"], capture_output=True, text=True, check=False)
    assert out.stdout.startswith("HTTP/1.1 403")


def test_ipv6_listener(tmp_path: Path) -> None:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    proc = subprocess.Popen(["egress-proxy", "--listen", "[::1]:0", "--socks", "[::1]:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        http = proc.stdout.readline().decode().split()[1]
        socks = proc.stdout.readline().decode().split()[1]
        assert http.startswith("http://[::1]:") and socks.startswith("socks5://[::1]:")
        out = subprocess.run(["curl", "-sS", "-i", "--max-time", "5", "-x", http,
                              "http://denied.test/"], capture_output=True, text=True, check=False)
        assert out.stdout.startswith("HTTP/1.1 403")
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
