"""Request bodies of every size through the real proxy, however their bytes arrive.

Issue 20: the head limit once counted body bytes read together with the head,
so bodies over ~32 KiB got 431 depending on how they arrived.  A stand-in
``sink`` upstream (HTTP/1.1, keep-alive, real ``100 Continue``) hashes what it
receives; each case checks the sha256, the framing and the trailers.

Routes: the inject path (TLS terminated, token set) reached by HTTP CONNECT and
by SOCKS5, the plain-HTTP forward path (absolute-form on the HTTP listener),
and plain HTTP through a SOCKS5 tunnel.

The matrix: every route x sizes 0 B, 1 B, 32 KiB - 1, 32 KiB, 32 KiB + 1,
64 KiB, 1 MiB x Content-Length or chunked (with a trailer) x with or without
``Expect: 100-continue`` x written in one send with the head or in small
pieces (224 cases).  100 MiB runs for the inject path over CONNECT and SOCKS5
and the plain-HTTP forward path, with Content-Length and chunked, without
Expect, in one stream (6 cases), plus the inject path over CONNECT with
Content-Length, Expect and small pieces (1 case).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from egress_proxyproc import ProxyProc, start_proxy
from egress_upstreams import Upstream, start_sink

KIB, MIB = 1 << 10, 1 << 20
SIZES = [0, 1, 32 * KIB - 1, 32 * KIB, 32 * KIB + 1, 64 * KIB, MIB]
ROUTES = ["inject-connect", "inject-socks", "plain-forward", "plain-socks"]
TOKEN = "sink-token-0123456789"
# Small pieces: a cycle of sizes; the first 40 KiB go out one read each (a
# pause after each send), so a head is cut mid-line and the 32 KiB mark falls
# inside reads of every kind.
PIECES = [1, 2, 5, 13, 100, 1000, 4096, 16384]
PAUSED_BYTES = 40 * KIB


@dataclass
class Sinks:
    tls: Upstream
    plain: Upstream
    proxy: ProxyProc
    tmp: Path

    def another_proxy(self, name: str) -> ProxyProc:
        """A fresh proxy before the same sinks (the caller stops it)."""
        tmp = self.tmp / name
        tmp.mkdir(exist_ok=True)
        proxy = start_proxy(
            ["--inject", "sink.test", "--resolve", f"sink.test:127.0.0.1:{self.tls.port}",
             "--allow", f"plain.test:{self.plain.port}", "--resolve", "plain.test:127.0.0.1",
             "--upstream-ca", str(self.tmp / "ca.pem"), "--egress-dir", str(tmp / "egress"),
             "--token-command", f"echo {TOKEN}"],
            log=tmp / "proxy.log", socks=True)
        proxy.egress_dir = tmp / "egress"
        return proxy


@pytest.fixture(scope="module")
def sinks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sinks]:
    tmp = tmp_path_factory.mktemp("bodies")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cert = ca.issue_cert("sink.test")
    cert.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
    tls = start_sink(str(tmp / "cert.pem"), str(tmp / "key.pem"))
    plain = start_sink(None, None)
    found = Sinks(tls, plain, None, tmp)  # type: ignore[arg-type]
    found.proxy = found.another_proxy("proxy")
    yield found
    assert found.proxy.stop() == 0
    tls.stop()
    plain.stop()


# --- the client: raw sockets, bytes written exactly as the case says ----------------


def _socks_connect(proxy: ProxyProc, host: str, port: int) -> socket.socket:
    assert proxy.socks is not None
    phost, pport = proxy.socks.rsplit(":", 1)
    s = socket.create_connection((phost, int(pport)), timeout=30)
    s.sendall(b"\x05\x01\x00")
    assert s.recv(2) == b"\x05\x00"
    name = host.encode()
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
    got = b""
    while len(got) < 10:
        got += s.recv(10 - len(got))
    assert got[1] == 0, got
    return s


def open_route(sinks: Sinks, route: str) -> tuple[socket.socket, bytes, bytes]:
    """A connected client socket for ``route``, the request target and Host."""
    proxy = sinks.proxy
    if route == "plain-forward":
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        authority = f"plain.test:{sinks.plain.port}".encode()
        return s, b"http://" + authority + b"/up", authority
    if route == "plain-socks":
        s = _socks_connect(proxy, "plain.test", sinks.plain.port)
        return s, b"/up", f"plain.test:{sinks.plain.port}".encode()
    if route == "inject-socks":
        s = _socks_connect(proxy, "sink.test", 443)
    else:
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        s.sendall(b"CONNECT sink.test:443 HTTP/1.1\r\nHost: sink.test:443\r\n\r\n")
        established = b""
        while not established.endswith(b"\r\n\r\n"):
            established += s.recv(1)
        assert established.startswith(b"HTTP/1.1 200"), established
    ctx = ssl.create_default_context(cafile=str(proxy.egress_dir / "ca.pem"))  # type: ignore[operator]
    return ctx.wrap_socket(s, server_hostname="sink.test"), b"/up", b"sink.test"


class Responses:
    """Responses read off a socket by hand (1xx kept apart), several per connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"the connection ended; unread {self.buf[:200]!r}")
        self.buf += data

    def next(self) -> tuple[int, dict[str, str], bytes]:
        """The next response (1xx included): status, headers, body."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip()
                   for k, v in (line.split(":", 1) for line in lines[1:])}
        size = 0 if status < 200 else int(headers.get("content-length", "0"))
        while len(self.buf) < size:
            self._fill()
        body, self.buf = self.buf[:size], self.buf[size:]
        return status, headers, body

    def final(self) -> tuple[int, dict[str, str], bytes, list[dict[str, str]]]:
        """The next final response and the 1xx before it."""
        early = []
        while True:
            status, headers, body = self.next()
            if status >= 200:
                return status, headers, body, early
            early.append(headers | {":status": str(status)})


def body_blocks(size: int) -> Iterator[bytes]:
    """``size`` bytes of a body, in blocks of at most 1 MiB (the same for a size)."""
    block = random.Random(size).randbytes(min(size, MIB))
    left = size
    while left > 0:
        yield block[:left]
        left -= min(left, len(block))


def sha256_of(size: int) -> str:
    digest = hashlib.sha256()
    for block in body_blocks(size):
        digest.update(block)
    return digest.hexdigest()


def encoded(size: int, chunked: bool) -> Iterator[bytes]:
    """The body on the wire: as is, or chunked (odd chunk sizes, an extension, a trailer)."""
    if not chunked:
        yield from body_blocks(size)
        return
    for block in body_blocks(size):
        view = memoryview(block)
        while view:
            n = min(len(view), 40000)
            yield b"%x;ext=v\r\n" % n + bytes(view[:n]) + b"\r\n"
            view = view[n:]
    yield b"0\r\nX-Sum: " + sha256_of(size).encode() + b"\r\n\r\n"


def request_head(target: bytes, host: bytes, size: int, chunked: bool, expect: bool,
                 path: bytes = b"/up", extra: bytes = b"") -> bytes:
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
    return (b"POST " + target.replace(b"/up", path) + b" HTTP/1.1\r\nHost: " + host
            + b"\r\n" + framing + b"\r\n" + (b"Expect: 100-continue\r\n" if expect else b"")
            + b"Authorization: Bearer forged\r\n" + extra + b"\r\n")


def in_pieces(data: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """``data`` re-cut into the PIECES cycle: (piece, pause after it)."""
    sent = 0
    turn = 0
    for block in data:
        view = memoryview(block)
        while view:
            n = PIECES[turn % len(PIECES)] if sent < PAUSED_BYTES else len(view)
            turn += 1
            yield bytes(view[:n]), sent < PAUSED_BYTES
            sent += min(n, len(view))
            view = view[n:]


def write(sock: socket.socket, data: Iterator[bytes], pieces: bool) -> None:
    if not pieces:
        for block in data:
            sock.sendall(block)
        return
    for piece, pause in in_pieces(data):
        sock.sendall(piece)
        if pause:
            time.sleep(0.001)


def upload(sinks: Sinks, route: str, size: int, chunked: bool, expect: bool,
           pieces: bool) -> dict[str, object]:
    """One POST of ``size`` bytes; the sink's answer (after checking the status)."""
    sock, target, host = open_route(sinks, route)
    with sock:
        head = request_head(target, host, size, chunked, expect)
        responses = Responses(sock)
        body = encoded(size, chunked)
        if expect and pieces:
            # A patient client: the head, then the body only once the upstream
            # said 100 (from the upstream, not made up by the proxy).
            write(sock, iter([head]), pieces=True)
            status, headers, _ = responses.next()
            assert (status, headers.get("x-upstream")) == (100, "sink"), (status, headers)
        else:
            first = next(body, b"")
            body = iter([head + first, *body])
        write(sock, body, pieces)
        status, headers, answer, early = responses.final()
    assert status == 200, (status, answer)
    assert all(h.get("x-upstream") == "sink" for h in early), early
    result: dict[str, object] = json.loads(answer)
    return result


def check(sinks: Sinks, route: str, got: dict[str, object], size: int, chunked: bool) -> None:
    assert got["sha256"] == sha256_of(size)
    assert got["length"] == size
    assert got["chunked"] is chunked
    if chunked:
        trailers = {k.lower(): v for k, v in got["trailers"]}  # type: ignore[attr-defined]
        # An inject host gets no trailer of the client's (fields after the
        # rewritten head would go unjudged); a plain forward passes them.
        assert trailers.get("x-sum") == (None if route.startswith("inject")
                                         else sha256_of(size))
    if route.startswith("inject"):
        record = sinks.tls.seen[-1]
        auth = [v for k, v in record["headers"] if k.lower() == "authorization"]
        assert auth == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize("pieces", [False, True], ids=["one-send", "pieces"])
@pytest.mark.parametrize("expect", [False, True], ids=["", "expect"])
@pytest.mark.parametrize("chunked", [False, True], ids=["cl", "chunked"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("route", ROUTES)
def test_body_arrives_whole(sinks: Sinks, route: str, size: int, chunked: bool, expect: bool,
                            pieces: bool) -> None:
    got = upload(sinks, route, size, chunked, expect, pieces)
    check(sinks, route, got, size, chunked)


@pytest.mark.parametrize(
    ("route", "chunked", "expect", "pieces"),
    [(route, chunked, False, False)
     for route in ("inject-connect", "inject-socks", "plain-forward")
     for chunked in (False, True)]
    + [("inject-connect", False, True, True)],
)
def test_100_mib_body(sinks: Sinks, route: str, chunked: bool, expect: bool,
                      pieces: bool) -> None:
    got = upload(sinks, route, 100 * MIB, chunked, expect, pieces)
    check(sinks, route, got, 100 * MIB, chunked)


# --- what else can follow a head in one read ------------------------------------------

TRICKY = b"\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n"


@pytest.mark.parametrize("pieces", [False, True], ids=["one-send", "pieces"])
@pytest.mark.parametrize("route", ["inject-connect", "inject-socks", "plain-forward"])
def test_pipelined_requests_after_bodies(sinks: Sinks, route: str, pieces: bool) -> None:
    """Three requests in one write: a body's bytes never become a request, nor the reverse."""
    sock, target, host = open_route(sinks, route)
    body = TRICKY * 1000  # 46 KiB that look like requests
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:1000], body[1000:]))
    stream = (request_head(target, host, len(body), False, False, path=b"/p1") + body
              + request_head(target, host, 0, True, False, path=b"/p2") + chunked
              + b"0\r\nX-Sum: two\r\n\r\n"
              + b"GET " + target.replace(b"/up", b"/p3") + b" HTTP/1.1\r\nHost: " + host
              + b"\r\nConnection: close\r\n\r\n")
    with sock:
        write(sock, iter([stream]), pieces)
        responses = Responses(sock)
        answers = [json.loads(responses.final()[2]) for _ in range(3)]
    want = hashlib.sha256(body).hexdigest()
    assert [(a["path"], a["sha256"], a["length"]) for a in answers] == [
        ("/p1", want, len(body)), ("/p2", want, len(body)),
        ("/p3", hashlib.sha256(b"").hexdigest(), 0)]
    sent = ["X-Sum", "two"] in [[k.title(), v] for k, v in answers[1]["trailers"]]
    assert sent is not route.startswith("inject")
    seen = sinks.tls.seen + sinks.plain.seen
    assert not [r for r in seen if "smuggled" in r["path"]]


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ssl.SSLError, ConnectionResetError):
        return True


@pytest.mark.parametrize("route", ["inject-connect", "inject-socks", "plain-forward"])
def test_a_refused_expectation_reaches_the_client(sinks: Sinks, route: str) -> None:
    """The upstream's final 413 (no 100) is what the client gets, and the connection ends.

    The client never sends the body it announced, so the proxy says it closes
    (else the client's next request would be read as that body) and does.
    """
    sock, target, host = open_route(sinks, route)
    with sock:
        sock.sendall(request_head(target, host, MIB, False, True, path=b"/refuse"))
        status, headers, answer = Responses(sock).next()
        assert (status, json.loads(answer)) == (413, {"refused": True})
        assert headers.get("connection") == "close"
        sock.settimeout(5)
        started = time.monotonic()
        assert _closed(sock)
        assert time.monotonic() - started < 5


def _padded_head(target: bytes, host: bytes, size: int, total: int) -> bytes:
    """A Content-Length head of exactly ``total`` bytes."""
    bare = request_head(target, host, size, False, False)
    pad = total - len(bare) - len(b"X-Pad: \r\n")
    head = request_head(target, host, size, False, False, extra=b"X-Pad: " + b"p" * pad + b"\r\n")
    assert len(head) == total
    return head


@pytest.mark.parametrize("route", ["inject-connect", "plain-forward"])
def test_the_head_limit_counts_head_bytes_only(sinks: Sinks, route: str) -> None:
    body = b"b" * (64 * KIB)
    sock, target, host = open_route(sinks, route)
    with sock:
        sock.sendall(_padded_head(target, host, len(body), 32 * KIB) + body)
        status, _, answer, _ = Responses(sock).final()
    assert status == 200
    assert json.loads(answer)["sha256"] == hashlib.sha256(body).hexdigest()
    before = sinks.proxy.log_text().count("431 request head too large")
    sock, target, host = open_route(sinks, route)
    with sock:
        sock.sendall(_padded_head(target, host, len(body), 32 * KIB + 1) + body)
        status, _, answer = Responses(sock).next()
    assert status == 431, answer
    assert b"request head too large" in answer
    deadline = time.monotonic() + 10  # the log line is written after the answer: wait for it
    while (seen := sinks.proxy.log_text().count("431 request head too large")) == before:
        assert time.monotonic() < deadline, "no log line for the refusal"
        time.sleep(0.02)
    assert seen == before + 1



@pytest.mark.parametrize("route", ["inject-connect", "plain-forward"])
def test_a_refused_client_still_sending_reads_the_answer(sinks: Sinks, route: str) -> None:
    # The refusal comes while the client is still sending (its head over the limit, its
    # body behind it).  The proxy reads and drops the rest until the client hangs up:
    # closing on unread bytes would reset the connection under the client's writes
    # (curl: "Send failure: Broken pipe") and it would never see why.
    sock, target, host = open_route(sinks, route)
    with sock:
        sock.sendall(_padded_head(target, host, 4 * MIB, 32 * KIB + 1))
        status, _, answer = Responses(sock).next()
        assert status == 431, answer
        for _ in range(4 * MIB // (64 * KIB)):  # the body, after the answer came
            sock.sendall(b"b" * (64 * KIB))
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # then the proxy's close: an end, not a reset
            pass


# --- bounded memory ---------------------------------------------------------------------


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


UPLOAD_GIB = 1


@pytest.fixture
def fresh(sinks: Sinks) -> Iterator[Sinks]:
    """The sinks before a proxy of their own, whose peak RSS nothing else raised."""
    proxy = sinks.another_proxy("fresh")
    yield Sinks(sinks.tls, sinks.plain, proxy, sinks.tmp)
    assert proxy.stop() == 0


def test_a_1_gib_upload_keeps_the_proxy_small(fresh: Sinks, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    """Through the inject path the proxy's peak RSS grows by less than 4 MiB.

    A warm-up upload of 1 MiB first loads h11, issues the leaf and sizes the
    buffers; then 1 GiB streams through the same process in 4 MiB writes.
    """
    pid = fresh.proxy.proc.pid
    check(fresh, "inject-connect", upload(fresh, "inject-connect", MIB, False, False, False),
          MIB, False)
    before = _peak_rss_kib(pid)
    size = UPLOAD_GIB << 30
    sock, target, host = open_route(fresh, "inject-connect")
    digest = hashlib.sha256()
    with sock:
        sock.sendall(request_head(target, host, size, False, False))
        block = random.Random(7).randbytes(4 * MIB)
        for _ in range(size // len(block)):
            sock.sendall(block)
            digest.update(block)
        status, _, answer, _ = Responses(sock).final()
    assert status == 200
    assert json.loads(answer)["sha256"] == digest.hexdigest()
    grown = (_peak_rss_kib(pid) - before) / 1024
    with capsys.disabled():
        print(f" [1 GiB upload: proxy peak RSS {before / 1024:.1f} MiB, grew {grown:.2f} MiB]",
              end="")
    assert grown < 4, f"peak RSS grew by {grown:.1f} MiB"


@pytest.mark.parametrize("cut", ["request-line", "mid-head", "head-end", "body+1", "32k"])
@pytest.mark.parametrize("route", ["inject-connect", "plain-forward"])
def test_one_request_split_in_two_reads(sinks: Sinks, route: str, cut: str) -> None:
    """The pure reader's split-anywhere property, for a few split points, end to end."""
    body = TRICKY * 1000
    sock, target, host = open_route(sinks, route)
    data = request_head(target, host, len(body), False, False) + body
    end = data.index(b"\r\n\r\n") + 4
    at = {"request-line": 3, "mid-head": end // 2, "head-end": end, "body+1": end + 1,
          "32k": 32 * KIB}[cut]
    with sock:
        sock.sendall(data[:at])
        time.sleep(0.05)
        sock.sendall(data[at:])
        status, _, answer, _ = Responses(sock).final()
    assert status == 200
    assert json.loads(answer)["sha256"] == hashlib.sha256(body).hexdigest()
