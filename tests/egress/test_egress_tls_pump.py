"""Large bodies on the inject path, moved by a pump thread (libegress.tls_pump, bulk_body).

In process, over real loopback TCP and real TLS: a client and an origin at the
ends (blocking ssl sockets in threads of their own, written apart from the
proxy's code), and between them the inject path's own pieces as it runs them
(TlsStream both ways, ClientSide, UpstreamSide, exchange, the request rewritten
with the token by intercept.upstream_request), on a keep-alive connection:

- downloads and uploads at 0 B, 1 B, the pump's threshold and step -1/0/+1
  and several MiB, written in one send or with their first and last bytes one
  TLS record each; the bytes' digests compared, every request seen by the
  origin with the token, and a pump used exactly when the body is large enough;
- a body and its answer pumped at once (an origin echoing as it reads);
- several requests on one connection, large and small, each injected; past
  the cap on pumps at once, large bodies whole the ordinary way;
- chunked bodies both ways (libegress.chunks: a ChunkedPump takes them up once
  BULK bytes went the ordinary way): sizes around the threshold and the step,
  chunks of 1000 B, 16 KiB and one whole, in one write or edges; after the
  data, the last chunk with and without trailers, chunks only h11 reads (an
  extension, whitespace) and hostile ones (bad hex, 21 digits, a bare LF, a
  footer that is not CRLF, the origin's end mid-chunk): the client gets the
  same bytes and the proxy ends the same way as with no pump at all; a
  client's hostile chunk mid-upload is refused (400) in h11's words either way;
- a client gone mid-upload, an origin resetting mid-download, a silent origin
  and one trickling a TLS record a byte at a time (504), a silent client (408)
  mid-body, and the proxy's task cancelled
  mid-body (its shutdown): each leaves no pump thread and no task behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import trustme

from libegress import bulk_body
from libegress.bulk_body import BULK
from libegress.http1 import ClientSide, HttpError, UpstreamSide, exchange
from libegress.intercept import upstream_request
from libegress.limits import Limits
from libegress.streams import READ_SIZE, SocketStream, TlsStream
from libegress.tls_pump import STEP, ChunkedPump, Pump

MIB = 1 << 20
HOST = "pump.test"
TOKEN = b"Bearer pump-token"
SIZES = sorted({0, 1, BULK - 1, BULK, BULK + 1, STEP - 1, STEP, STEP + 1,
                2 * STEP - 1, 2 * STEP, 2 * STEP + 1, 3 * MIB + 3})
EDGE = 300  # "edges": this many bytes at each end of a body go one TLS record each


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def pieces(data: bytes, mode: str) -> Iterator[bytes]:
    if mode == "one" or len(data) <= 2 * EDGE:
        yield from ([data] if mode == "one" else [data[i:i + 1] for i in range(len(data))])
        return
    yield from (data[i:i + 1] for i in range(EDGE))
    yield data[EDGE:-EDGE]
    yield from (data[i:i + 1] for i in range(len(data) - EDGE, len(data)))


@pytest.fixture(scope="module")
def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(HOST).configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


@pytest.fixture
def pumps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The count of each pump started (the real Pump, counted)."""
    started: list[int] = []

    class Counted(Pump):
        async def run(self) -> int:
            started.append(self.count)
            return await super().run()

    class CountedChunks(ChunkedPump):
        async def run(self) -> int:
            started.append(-1)  # a chunked body's pump: no count known
            return await super().run()

    monkeypatch.setattr(bulk_body, "Pump", Counted)
    monkeypatch.setattr(bulk_body, "ChunkedPump", CountedChunks)
    return started


def pumping(pumps: list[int]) -> Callable[[], None]:
    """A gate for a misbehaving end: wait until a pump has started (then a little more)."""
    def wait() -> None:
        deadline = time.monotonic() + 30
        while not pumps and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
    return wait


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


def read_head(tls: ssl.SSLSocket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = tls.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    return head


def field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


# What follows a chunked body's data chunks, and the data it adds when whole.
TAILS: dict[str, tuple[bytes, bytes | None]] = {
    "end": (b"0\r\n\r\n", b""),
    "trailers": (b"0\r\nX-Trailer: 1\r\n\r\n", b""),
    "ext": (b"5;name=value\r\nhello\r\n0\r\n\r\n", b"hello"),  # h11 reads these
    "space": (b"5 \r\nhello\r\n0\r\n\r\n", b"hello"),
    "badhex": (b"zz\r\nhello\r\n0\r\n\r\n", None),  # and refuses these
    "digits": (b"1" * 21 + b"\r\nhello\r\n0\r\n\r\n", None),
    "lf": (b"5\nhello\r\n0\r\n\r\n", None),
    "footer": (b"5\r\nhelloXX0\r\n\r\n", None),
    "cut": (b"10\r\nhello", None),  # then the origin closes
}


def chunked(data: bytes, size: int, tail: str) -> bytes:
    """``data`` as chunks of ``size`` (0: one chunk), then TAILS[tail]."""
    size = size or max(len(data), 1)
    out = [b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
           for i in range(0, len(data), size)]
    return b"".join(out) + TAILS[tail][0]


def read_chunked(tls: ssl.SSLSocket, buf: bytearray) -> tuple[bytes, bool]:
    """A chunked body as it comes (written apart from the proxy's reader); whether whole."""
    data = bytearray()

    def line() -> bytes | None:
        while b"\r\n" not in buf:
            more = tls.recv(65536)
            if not more:
                return None
            buf.extend(more)
        got, _, rest = bytes(buf).partition(b"\r\n")
        buf[:] = rest
        return got

    while (size_line := line()) is not None:
        size = int(size_line, 16)
        if not size:
            while line():  # trailers, up to the empty line
                pass
            return bytes(data), True
        try:
            data += read_body(tls, buf, size + 2)[:size]
        except (ConnectionResetError, ssl.SSLError):
            break
    return bytes(data), False


def read_body(tls: ssl.SSLSocket, buf: bytearray, length: int) -> bytes:
    while len(buf) < length:
        chunk = tls.recv(min(length - len(buf), MIB))
        if not chunk:
            raise ConnectionResetError(f"the body ended at {len(buf)} of {length}")
        buf += chunk
    body, buf[:] = bytes(buf[:length]), buf[length:]
    return body


def reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): a reset, not an end."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Origin:
    """GET /SIZE/MODE answers payload(SIZE, 9); PUT answers the body's sha256.

    Each answer says the Authorization the request came with.  ``cut`` (bytes
    of a GET body, then a reset) and ``stall`` (bytes, then silence) misbehave.
    """

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, cut: int | None = None,
                 stall: int | None = None, trickle: int | None = None,
                 gate: Callable[[], object] = lambda: None) -> None:
        self.sock, self.ctx, self.cut, self.stall, self.gate = sock, ctx, cut, stall, gate
        self.seen: list[bytes | None] = []
        self.done = threading.Event()
        serve = self._serve if trickle is None else lambda: self._trickle(trickle)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def _trickle(self, size: int) -> None:
        """A 4 MiB answer: ``size`` bytes, then TLS records' bytes, one every 0.1 s.

        TLS by hand (a memory BIO), so that a record can go out in pieces.
        """
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.ctx.wrap_bio(incoming, outgoing, server_side=True)

        def step(call: Callable[[], object]) -> object:
            while True:
                try:
                    return call()
                except ssl.SSLWantReadError:
                    self.sock.sendall(outgoing.read())
                    incoming.write(self.sock.recv(65536) or b"")
        try:
            step(tls.do_handshake)
            head = b""
            while b"\r\n\r\n" not in head:
                head += cast(bytes, step(lambda: tls.read(65536)))
            tls.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (4 * MIB))
            tls.write(payload(size, 9))
            self.sock.sendall(outgoing.read())
            while True:  # records of the rest, each a byte at a time
                tls.write(b"x" * 1000)
                for byte in outgoing.read():
                    if self.done.wait(0.1):
                        return
                    self.sock.sendall(bytes([byte]))
        except (OSError, ssl.SSLError):
            pass
        finally:
            self.done.set()

    def _serve(self) -> None:
        try:
            with self.ctx.wrap_socket(self.sock, server_side=True) as tls:
                buf = bytearray()
                while (head := read_head(tls, buf)) is not None:
                    self.seen.append(field(head, b"authorization"))
                    self._answer(tls, buf, head)
        except (OSError, ssl.SSLError):
            pass
        finally:
            self.done.set()

    def _answer(self, tls: ssl.SSLSocket, buf: bytearray, head: bytes) -> None:
        method, target = head.split(b" ")[:2]
        auth = b"X-Seen: " + (self.seen[-1] or b"none") + b"\r\n"
        if method == b"POST":  # an echo: the answer streams while the body still comes
            left = int(field(head, b"content-length") or 0)
            tls.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (auth, left))
            while left:
                piece = bytes(buf[:left]) if buf else tls.recv(min(left, MIB))
                del buf[:len(piece)]
                if not piece:
                    raise ConnectionResetError
                tls.sendall(piece)
                left -= len(piece)
            return
        if method == b"PUT":
            if field(head, b"transfer-encoding") == b"chunked":
                body, whole = read_chunked(tls, buf)
                if not whole:
                    raise ConnectionResetError
            else:
                body = read_body(tls, buf, int(field(head, b"content-length") or 0))
            answer = hashlib.sha256(body).hexdigest().encode()
            tls.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s"
                        % (auth, len(answer), answer))
            return
        _, size, mode, *chunking = target.decode().split("/")
        data = payload(int(size), 9)
        if chunking:  # /SIZE/MODE/CHUNK/TAIL
            tls.sendall(b"HTTP/1.1 200 OK\r\n%sTransfer-Encoding: chunked\r\n\r\n" % auth)
            framing = chunked(data, int(chunking[0]), chunking[1])
            if self.stall is not None:
                tls.sendall(framing[:self.stall])
                self.done.wait(30)  # silent until the test ends
                return
            for piece in pieces(framing, mode):
                tls.sendall(piece)
            if chunking[1] == "cut":
                raise ConnectionResetError
            return
        tls.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (auth, len(data)))
        if self.cut is not None or self.stall is not None:
            tls.sendall(data[:self.cut or self.stall])
            if self.cut is not None:
                self.gate()
                reset(self.sock)
                raise ConnectionResetError
            self.done.wait(30)  # silent until the test ends
            return
        for piece in pieces(data, mode):
            tls.sendall(piece)


class Client:
    """Sends ``script``'s requests on one connection, in order; records what came back."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext,
                 script: Callable[[ssl.SSLSocket, Client], None]) -> None:
        self.sock, self.ctx, self.script = sock, ctx, script
        self.buf = bytearray()
        self.error: BaseException | None = None
        self.released = threading.Event()  # set once the proxy's side has ended
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.ctx.wrap_socket(self.sock, server_hostname=HOST) as tls:
                self.script(tls, self)
        except BaseException as exc:  # checked by the test
            self.error = exc

    def response(self, tls: ssl.SSLSocket) -> tuple[bytes, bytes]:
        head = read_head(tls, self.buf)
        assert head is not None, "the proxy ended the connection"
        assert head.startswith(b"HTTP/1.1 200 "), head
        seen = field(head, b"x-seen") or b""
        return seen, read_body(tls, self.buf, int(field(head, b"content-length") or 0))

    def download(self, tls: ssl.SSLSocket, size: int, mode: str) -> None:
        tls.sendall(b"GET /%d/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer forged\r\n\r\n"
                    % (size, mode.encode(), HOST.encode()))
        seen, body = self.response(tls)
        assert seen == TOKEN
        assert hashlib.sha256(body).digest() == hashlib.sha256(payload(size, 9)).digest()

    def download_chunked(self, tls: ssl.SSLSocket, size: int, mode: str, chunk: int,
                         tail: str) -> tuple[bytes, bool]:
        tls.sendall(b"GET /%d/%s/%d/%s HTTP/1.1\r\nHost: %s\r\n\r\n"
                    % (size, mode.encode(), chunk, tail.encode(), HOST.encode()))
        head = read_head(tls, self.buf)
        assert head is not None and head.startswith(b"HTTP/1.1 200 "), head
        assert field(head, b"x-seen") == TOKEN
        assert field(head, b"transfer-encoding") == b"chunked"
        return read_chunked(tls, self.buf)

    def upload_chunked(self, tls: ssl.SSLSocket, size: int, mode: str, chunk: int,
                       tail: str = "trailers") -> None:
        data = payload(size, 13)
        tls.sendall(b"PUT /sink HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                    % HOST.encode())
        for piece in pieces(chunked(data, chunk, tail), mode):
            tls.sendall(piece)
        if TAILS[tail][1] is None:
            self.released.wait(30)  # refused: hold on until the proxy has ended
            return
        seen, answer = self.response(tls)
        assert seen == TOKEN
        assert answer.decode() == hashlib.sha256(data).hexdigest()

    def upload(self, tls: ssl.SSLSocket, size: int, mode: str) -> None:
        data = payload(size, 11)
        tls.sendall(b"PUT /sink HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                    % (HOST.encode(), size))
        for piece in pieces(data, mode):
            tls.sendall(piece)
        seen, answer = self.response(tls)
        assert seen == TOKEN
        assert answer.decode() == hashlib.sha256(data).hexdigest()


async def proxy(near_client: socket.socket, near_origin: socket.socket,
                contexts: tuple[ssl.SSLContext, ssl.SSLContext], limits: Limits,
                response_timeout: float = 30.0) -> None:
    """The inject path between the two: each request rewritten with the token, then exchanged."""
    streams: list[TlsStream] = []
    try:
        for sock in (near_client, near_origin):
            sock.setblocking(False)
        streams.append(await TlsStream.server(SocketStream(near_client), contexts[0], b""))
        streams.append(await TlsStream.client(SocketStream(near_origin), contexts[1], HOST))
        client = ClientSide(streams[0], limits)
        upstream = UpstreamSide(streams[1], response_timeout)
        while (request := await client.next_request()) is not None:
            await exchange(client, upstream, upstream_request(
                request, request.target, (b"Authorization", TOKEN)), trailers=False)
            if not client.next_cycle() or not upstream.reusable():
                break
    finally:
        for tls in streams:
            with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
                await asyncio.wait_for(tls.shutdown(), 1.0)
        near_client.close()
        near_origin.close()


def run_through(contexts: tuple[ssl.SSLContext, ssl.SSLContext],
                script: Callable[[ssl.SSLSocket, Client], None],
                limits: Limits | None = None, cancel_when: Callable[[], bool] | None = None,
                response_timeout: float = 30.0, gate: Callable[[], object] = lambda: None,
                **origin: int) -> tuple[Client, Origin, BaseException | None]:
    """``script`` through the proxy to an Origin; what the proxy's task raised, if anything."""
    near_client, far_client = tcp_pair()
    near_origin, far_origin = tcp_pair()
    far = Origin(far_origin, contexts[0], gate=gate, **origin)
    client = Client(far_client, contexts[1], script)

    async def main() -> BaseException | None:
        task = asyncio.ensure_future(proxy(near_client, near_origin, contexts,
                                           limits or Limits(), response_timeout))
        if cancel_when is not None:
            while not cancel_when():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the pump's thread in its wait by now
            task.cancel()
        try:
            await task
        except BaseException as exc:
            return exc
        finally:
            assert asyncio.all_tasks() == {asyncio.current_task()}, "a task was left behind"
        return None

    raised = asyncio.run(main())
    left = [t for t in threading.enumerate() if t.name.startswith("egress-pump")]
    assert not left, "a pump was left"
    client.released.set()
    far_client.close()
    far.done.set()
    client.thread.join(30)
    far.thread.join(30)
    assert not client.thread.is_alive() and not far.thread.is_alive()
    return client, far, raised


def pumped(pumps: list[int], sizes: list[int]) -> None:
    """A pump moved the rest of each body big enough, none of a small one.

    Body bytes read with the head go the ordinary way, so a pump moves at most
    the body; at least BULK (else none runs), always once a read's worth
    (READ_SIZE) more than that remains.
    """
    assert all(count >= BULK for count in pumps)
    assert len(pumps) <= sum(size >= BULK for size in sizes)
    assert len(pumps) >= sum(size >= BULK + READ_SIZE for size in sizes)


@pytest.mark.parametrize("mode", ["one", "edges"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("way", ["download", "upload"])
def test_every_size_arrives_whole_and_injected(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int], way: str,
        size: int, mode: str) -> None:
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        getattr(client, way)(tls, size, mode)

    client, origin, raised = run_through(contexts, script)
    assert client.error is None and raised is None
    assert origin.seen == [TOKEN]
    pumped(pumps, [size])


def test_one_connection_carries_many_each_injected(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int]) -> None:
    sizes = [3 * MIB + 1, 0, BULK, 1, BULK - 1, 2 * STEP + 1, 7]

    def script(tls: ssl.SSLSocket, client: Client) -> None:
        for size in sizes:
            client.download(tls, size, "edges")
            client.upload(tls, size, "one")

    client, origin, raised = run_through(contexts, script)
    assert client.error is None and raised is None
    assert origin.seen == [TOKEN] * 2 * len(sizes)
    pumped(pumps, [s for s in sizes for _ in "du"])


def echo(tls: ssl.SSLSocket, client: Client, size: int) -> None:
    """POST ``size`` bytes while reading the echo as it comes (one thread, non-blocking)."""
    data = payload(size, 5)
    out = memoryview(b"POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                     % (HOST.encode(), size) + data)
    got = bytearray()
    tls.setblocking(False)
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < size:
        readable, writable, _ = select.select([tls], [tls] if out else [], [], 30)
        assert readable or writable or tls.pending(), "the echo stalled"
        if writable:
            with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError):
                out = out[tls.send(out[:256 * 1024]):]
        with contextlib.suppress(ssl.SSLWantReadError):
            chunk = tls.recv(MIB)
            assert chunk, "the proxy ended the connection"
            got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert field(head, b"x-seen") == TOKEN
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("size", [2 * STEP + 1, 8 * MIB + 5])
def test_a_body_and_its_answer_both_pumped_at_once(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int], size: int) -> None:
    """An origin echoing as it reads: the request's and the response's pumps run together
    (neither can finish alone once the socket buffers are full)."""
    client, origin, raised = run_through(contexts, lambda tls, c: echo(tls, c, size))
    assert client.error is None and raised is None
    assert origin.seen == [TOKEN]
    assert len(pumps) == 2, pumps


def upload_then(cut: Callable[[ssl.SSLSocket, Client], object]
                ) -> Callable[[ssl.SSLSocket, Client], None]:
    """An upload of 4 MiB announced, 1 MiB sent, then ``cut``."""
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        tls.sendall(b"PUT /sink HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                    % (HOST.encode(), 4 * MIB))
        tls.sendall(payload(MIB, 3))
        cut(tls, client)
    return script


def test_a_client_gone_mid_upload_leaves_nothing(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int]) -> None:
    gate = pumping(pumps)
    _, _, raised = run_through(contexts, upload_then(lambda tls, client: (gate(), reset(tls))))
    assert len(pumps) == 1
    # A reset reads as one (OSError); an end, as the body cut short (400).
    assert isinstance(raised, OSError | HttpError), raised


def test_an_origin_reset_mid_download_leaves_nothing(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int]) -> None:
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        tls.sendall(b"GET /%d/one HTTP/1.1\r\nHost: %s\r\n\r\n" % (4 * MIB, HOST.encode()))
        with contextlib.suppress(OSError, ssl.SSLError, AssertionError):
            client.response(tls)

    _, _, raised = run_through(contexts, script, gate=pumping(pumps), cut=MIB)
    assert len(pumps) == 1
    assert isinstance(raised, OSError | HttpError | ssl.SSLError), raised


@pytest.mark.parametrize("framing", ["", "/16384/end"])
def test_a_silent_origin_mid_download_is_504_and_leaves_nothing(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int], framing: str) -> None:
    """Content-Length, then chunked (a ChunkedPump waiting in the middle of a chunk)."""
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        with contextlib.suppress(OSError, ssl.SSLError, AssertionError):
            if framing:
                client.download_chunked(tls, 4 * MIB, "one", 16384, "end")
                return
            tls.sendall(b"GET /%d/one HTTP/1.1\r\nHost: %s\r\n\r\n" % (4 * MIB, HOST.encode()))
            client.response(tls)

    _, _, raised = run_through(contexts, script, response_timeout=0.5,
                               stall=3 * MIB if framing else MIB)
    assert pumps
    assert isinstance(raised, HttpError) and raised.status == 504, raised
    assert str(raised) == "the upstream did not answer in time"


def test_an_origin_trickling_a_record_mid_download_is_504(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int]) -> None:
    """Bytes keep coming, no record is ever whole: the response timeout runs all the same."""
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        tls.sendall(b"GET /%d/one HTTP/1.1\r\nHost: %s\r\n\r\n" % (4 * MIB, HOST.encode()))
        with contextlib.suppress(OSError, ssl.SSLError, AssertionError):
            client.response(tls)

    _, _, raised = run_through(contexts, script, response_timeout=0.5, trickle=MIB)
    assert len(pumps) == 1
    assert isinstance(raised, HttpError) and raised.status == 504, raised


def test_a_silent_client_mid_upload_is_408_and_leaves_nothing(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int]) -> None:
    _, _, raised = run_through(contexts, upload_then(lambda tls, client: client.released.wait(30)),
                               limits=Limits(idle_timeout=0.5))
    assert len(pumps) == 1
    assert isinstance(raised, HttpError) and raised.status == 408, raised
    assert str(raised) == "the request body stalled"


@pytest.mark.parametrize("way", ["download", "download-chunked", "upload"])
def test_the_proxy_ending_mid_body_ends_its_pump(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int], way: str) -> None:
    """Cancelled as on the proxy's shutdown, while a pump waits: it ends, nothing is left."""
    if way == "upload":
        script = upload_then(lambda tls, client: client.released.wait(30))
        origin: dict[str, int] = {}
    else:
        framing = b"/16384/end" if way == "download-chunked" else b""

        def script(tls: ssl.SSLSocket, client: Client) -> None:
            tls.sendall(b"GET /%d/one%s HTTP/1.1\r\nHost: %s\r\n\r\n"
                        % (4 * MIB, framing, HOST.encode()))
            client.released.wait(30)
        origin = {"stall": 3 * MIB if framing else MIB}
    _, _, raised = run_through(contexts, script, cancel_when=lambda: bool(pumps), **origin)
    assert len(pumps) == 1
    assert isinstance(raised, asyncio.CancelledError), raised


def test_past_the_pumps_cap_bodies_go_the_ordinary_way(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_body, "MAX_PUMPS", 0)

    def script(tls: ssl.SSLSocket, client: Client) -> None:
        client.download(tls, 3 * MIB + 1, "edges")
        client.upload(tls, 3 * MIB + 1, "one")

    client, origin, raised = run_through(contexts, script)
    assert client.error is None and raised is None
    assert origin.seen == [TOKEN, TOKEN]
    assert pumps == []


CHUNKED_SIZES = sorted({0, 1, BULK - 1, BULK, BULK + 1, 2 * BULK + 1, 3 * MIB + 3})


@pytest.mark.parametrize(("mode", "chunk"), [("one", 16384), ("edges", 1000), ("one", 0)])
@pytest.mark.parametrize("size", CHUNKED_SIZES)
def test_chunked_bodies_arrive_whole_both_ways(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int], size: int, mode: str,
        chunk: int) -> None:
    """Both ways on one connection; a chunked pump once BULK went the ordinary way."""
    def script(tls: ssl.SSLSocket, client: Client) -> None:
        data, whole = client.download_chunked(tls, size, mode, chunk, "trailers")
        assert whole and hashlib.sha256(data).digest() == hashlib.sha256(payload(size, 9)).digest()
        client.upload_chunked(tls, size, mode, chunk)

    client, origin, raised = run_through(contexts, script)
    assert client.error is None and raised is None
    assert origin.seen == [TOKEN, TOKEN]
    if size >= 3 * MIB:  # far past BULK: a pump took up the rest each way
        assert pumps.count(-1) >= 2, pumps
    if size < BULK:
        assert pumps == []


def chunked_outcome(contexts: tuple[ssl.SSLContext, ssl.SSLContext], tail: str,
                    mode: str) -> tuple[bytes, bool, str]:
    """What the client got of a 2 MiB chunked download ending in TAILS[tail], and how
    the proxy ended."""
    got: list[tuple[bytes, bool]] = []

    def script(tls: ssl.SSLSocket, client: Client) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            got.append(client.download_chunked(tls, 2 * MIB, mode, 16384, tail))

    client, _, raised = run_through(contexts, script)
    assert client.error is None and got
    ended = "" if raised is None else f"{type(raised).__name__} {raised}"
    if isinstance(raised, HttpError):
        ended += f" {raised.status}"
    return got[0][0], got[0][1], ended


@pytest.mark.parametrize("tail", list(TAILS))
def test_a_chunked_pump_ends_as_h11_would(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int],
        monkeypatch: pytest.MonkeyPatch, tail: str) -> None:
    """After 2 MiB of plain chunks, what only h11 reads: the same bytes reach the client and
    the proxy ends the same way with a pump as with none."""
    mode = "edges" if tail in ("badhex", "footer") else "one"
    pumped_outcome = chunked_outcome(contexts, tail, mode)
    assert pumps.count(-1) >= 1
    monkeypatch.setattr(bulk_body, "MAX_PUMPS", 0)
    assert pumped_outcome == chunked_outcome(contexts, tail, mode)
    data, whole, ended = pumped_outcome
    expected = TAILS[tail][1]
    assert data.startswith(payload(2 * MIB, 9))
    assert whole == (expected is not None) and (expected is None or data[2 * MIB:] == expected)
    if expected is None:
        assert "502" in ended or "Reset" in ended or "ended" in ended, ended


@pytest.mark.parametrize("tail", ["badhex", "lf", "footer"])
def test_a_chunked_upload_refused_as_h11_would(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext], pumps: list[int],
        monkeypatch: pytest.MonkeyPatch, tail: str) -> None:
    """A client's hostile chunk after 2 MiB: refused in h11's words with a pump as with none."""
    def ended() -> str:
        _, _, raised = run_through(contexts, lambda tls, client: client.upload_chunked(
            tls, 2 * MIB, "one", 16384, tail))
        assert isinstance(raised, HttpError) and raised.status == 400, raised
        return str(raised)

    with_pump = ended()
    assert pumps.count(-1) == 1
    monkeypatch.setattr(bulk_body, "MAX_PUMPS", 0)
    assert with_pump == ended() and with_pump.startswith("bad request: ")
