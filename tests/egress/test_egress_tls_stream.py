"""The TLS data path: libegress.streams.TlsStream, alone and inside the inject path.

TlsStream does large decryptions and encryptions in a worker pool, reads ahead
after a large read, and sizes its buffers to the traffic (docs: the module's
docstring).  Checked over real loopback TCP and real TLS, with random bytes
and their digests, at the sizes where that behaviour changes (0, 1, the
buffers' floor and the offload threshold +-1, a read's most +-1, many MiB),
written in one send, in uneven pieces, and byte by byte:

- both directions at once on one TLS connection (the SSL object entered from
  the loop and from workers);
- a reader whose every recv() times out almost at once still gets every byte,
  in order (a cancelled read is kept for the next call);
- shutdown with a read ahead under way ends it, leaving no task behind;
- through a real egress-proxy's inject path, downloads and uploads of those
  sizes, and several on one kept-alive connection (buffers growing and
  shrinking, a read ahead across requests, large bodies through a pump
  thread), each request reaching the origin with the proxy's token only.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import random
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from egress_proxyproc import ProxyProc, start_proxy

from libegress.streams import FLOOR, OFFLOAD, READ_SIZE, SocketStream, TlsStream

MIB = 1 << 20
SIZES = sorted({0, 1, FLOOR - 1, FLOOR, FLOOR + 1, OFFLOAD - 1, OFFLOAD, OFFLOAD + 1,
                READ_SIZE - 1, READ_SIZE, READ_SIZE + 1, 4 * READ_SIZE + 3, 24 * MIB + 1})
SMALL = [s for s in SIZES if s <= FLOOR + 1]  # byte by byte: one TLS record per byte
HOST = "stream.test"


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def pieces(data: bytes, mode: str, seed: int) -> Iterator[bytes]:
    if mode == "one":
        yield data
        return
    rng = random.Random(seed)
    i = 0
    while i < len(data):
        n = 1 if mode == "bytes" else rng.choice([1, 7, 1000, 16383, 16385, 70_000, 300_000])
        yield data[i:i + n]
        i += n


# -- TlsStream alone ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(HOST).configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def stream_pair(contexts: tuple[ssl.SSLContext, ssl.SSLContext]
                      ) -> tuple[TlsStream, TlsStream]:
    """A TLS server stream and client stream over one loopback TCP connection."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        csock = socket.socket()
        csock.setblocking(False)
        (ssock, _), _ = await asyncio.gather(loop.sock_accept(listener),
                                             loop.sock_connect(csock, listener.getsockname()))
    ssock.setblocking(False)
    return await asyncio.gather(TlsStream.server(SocketStream(ssock), contexts[0], b""),
                                TlsStream.client(SocketStream(csock), contexts[1], HOST))


async def send_all(stream: TlsStream, data: bytes, mode: str, seed: int) -> None:
    for piece in pieces(data, mode, seed):
        await stream.send(piece)


async def recv_exact(stream: TlsStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await stream.recv()
        assert chunk, f"the stream ended after {len(got)} of {size} bytes"
        assert len(chunk) <= READ_SIZE
        got += chunk
    return bytes(got)


async def end_both(a: TlsStream, b: TlsStream) -> None:
    """Shut both down (as the proxy does when a connection ends); each then reads the end."""
    await asyncio.gather(a.shutdown(), b.shutdown())
    assert await asyncio.wait_for(a.recv(), 10) == b""
    assert await asyncio.wait_for(b.recv(), 10) == b""


def close(*streams: TlsStream) -> None:
    for s in streams:
        s.raw.sock.close()


@pytest.mark.parametrize("mode", ["one", "pieces", "bytes"])
@pytest.mark.parametrize("size", SIZES)
def test_both_directions_at_once_arrive_whole(
        tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext], size: int, mode: str) -> None:
    if mode == "bytes" and size not in SMALL:
        pytest.skip("byte by byte only up to the offload threshold + 1")

    async def main() -> None:
        server, client = await stream_pair(tls_contexts)
        up, down = payload(size, 1), payload(size, 2)
        try:
            _, _, got_up, got_down = await asyncio.wait_for(asyncio.gather(
                send_all(client, up, mode, 3), send_all(server, down, mode, 4),
                recv_exact(server, size), recv_exact(client, size)), 120)
            await end_both(client, server)
        finally:
            close(server, client)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()

    asyncio.run(main())


@pytest.mark.parametrize("size", [FLOOR + 1, 3 * MIB + 5])
def test_a_timed_out_recv_loses_no_byte(
        tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext], size: int) -> None:
    async def main() -> None:
        server, client = await stream_pair(tls_contexts)
        data = payload(size, 5)
        sender = asyncio.create_task(send_all(server, data, "pieces", 6))
        got = bytearray()
        timeouts = 0
        try:
            while len(got) < size:
                try:
                    got += await asyncio.wait_for(client.recv(), 0.0005)
                except TimeoutError:
                    timeouts += 1
            await sender
            await end_both(client, server)
        finally:
            close(server, client)
        assert timeouts > 0  # the case this test is about happened
        assert bytes(got) == data

    asyncio.run(main())


def test_shutdown_ends_a_read_ahead_and_leaves_no_task(
        tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async def main() -> None:
        server, client = await stream_pair(tls_contexts)
        data = payload(2 * READ_SIZE, 7)
        try:
            await server.send(data)
            got = bytearray()
            while len(got) < len(data):
                got += await client.recv()  # large reads: a read ahead is under way after
            assert bytes(got) == data
            await asyncio.wait_for(client.shutdown(), 5)
            assert await asyncio.wait_for(server.recv(), 5) == b""  # close_notify came
        finally:
            close(server, client)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


# -- through egress-proxy's inject path ------------------------------------------------


class Origin:
    """A keep-alive HTTPS origin: GET /SIZE/MODE answers payload(SIZE, 9) written per
    MODE; PUT answers the sha256 of the body it read."""

    def __init__(self, tmp: Path) -> None:
        ca = trustme.CA()
        self.ca_file = tmp / "origin-ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(HOST).configure_cert(self.ctx)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = tls.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    method, target = head.split(b" ")[:2]
                    seen = b"X-Seen: " + b",".join(
                        line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                        if line.lower().startswith(b"authorization:")) + b"\r\n"
                    if method == b"PUT":
                        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length:"))
                        digest = hashlib.sha256()
                        while length:
                            if not buf:
                                buf = tls.recv(min(length, 1 << 20))
                                if not buf:
                                    return
                            take, buf = buf[:length], buf[length:]
                            digest.update(take)
                            length -= len(take)
                        answer = digest.hexdigest().encode()
                        tls.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s"
                                    % (seen, len(answer), answer))
                        continue
                    _, size, mode = target.decode().split("/")
                    data = payload(int(size), 9)
                    tls.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n"
                                % (seen, len(data)))
                    for piece in pieces(data, mode, 10):
                        tls.sendall(piece)
        except (OSError, ssl.SSLError):
            pass

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def inject(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyProc, Path]]:
    tmp = tmp_path_factory.mktemp("tls-stream")
    origin = Origin(tmp)
    proxy = start_proxy([f"--inject={HOST}", f"--resolve={HOST}:127.0.0.1:{origin.port}",
                         f"--upstream-ca={origin.ca_file}", f"--egress-dir={tmp / 'egress'}",
                         "--token-command=echo stream-token"], log=tmp / "proxy.log")
    yield proxy, tmp / "egress" / "bundle.pem"
    assert proxy.stop() == 0
    origin.close()


def connection(inject: tuple[ProxyProc, Path]) -> http.client.HTTPSConnection:
    proxy, bundle = inject
    conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, timeout=120,
                                       context=ssl.create_default_context(cafile=str(bundle)))
    conn.set_tunnel(HOST, 443)
    return conn


def download(conn: http.client.HTTPSConnection, size: int, mode: str) -> None:
    conn.request("GET", f"/{size}/{mode}", headers={"Authorization": "Bearer forged"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("X-Seen") == "Bearer stream-token"  # each request injected
    body = response.read()
    assert len(body) == size
    assert hashlib.sha256(body).digest() == hashlib.sha256(payload(size, 9)).digest()


def upload(conn: http.client.HTTPSConnection, size: int, mode: str) -> None:
    data = payload(size, 11)
    conn.putrequest("PUT", "/sink", skip_accept_encoding=True)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    for piece in pieces(data, mode, 12):
        conn.send(piece)
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("X-Seen") == "Bearer stream-token"
    assert response.read().decode() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("mode", ["one", "pieces", "bytes"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("way", ["download", "upload"])
def test_the_inject_path_moves_every_size_whole(
        inject: tuple[ProxyProc, Path], way: str, size: int, mode: str) -> None:
    if mode == "bytes" and size not in SMALL:
        pytest.skip("byte by byte only up to the offload threshold + 1")
    conn = connection(inject)
    try:
        (download if way == "download" else upload)(conn, size, mode)
    finally:
        conn.close()


def test_one_kept_alive_connection_carries_large_and_small_in_turn(
        inject: tuple[ProxyProc, Path]) -> None:
    """Buffers grow on the large ones and shrink on the small; after a large response
    the upstream side reads ahead, into the next response."""
    conn = connection(inject)
    try:
        for size in [4 * READ_SIZE + 3, 1, FLOOR + 1, 0, 9 * MIB, READ_SIZE - 1, 2]:
            download(conn, size, "pieces")
            upload(conn, size, "one")
    finally:
        conn.close()
