"""Byte streams over non-blocking sockets: plain, and TLS through memory BIOs.

The proxy keeps raw sockets (not asyncio transports) so that a CONNECT tunnel
can hand both file descriptors to the kernel (:mod:`libegress.splice`).  TLS is
done with ``ssl.SSLObject`` over memory BIOs: the TLS state machine stays pure,
and the reads and writes are this module's ``sock_recv``/``sock_sendall``.

Bulk TLS work runs off the event loop.  The inject path decrypts and
re-encrypts every body byte; on the loop's one thread that bound it to a third
of a direct transfer.  A decryption or encryption of at least ``OFFLOAD`` bytes
runs in :data:`CRYPTO` (a small thread pool: OpenSSL releases the GIL while it
works), and a stream that moves a large read reads the next one ahead, so one
direction's decryption overlaps the other's encryption and the loop's socket
calls.  The sockets stay on the loop's thread: a worker never holds a file
descriptor the loop could close and the kernel hand to another connection.
Each SSL object is entered by one thread at a time (its ``_lock``).  Small
reads and writes (heads, small bodies) stay on the loop: a thread hop would
cost them more than it saves.

A large Content-Length body does not come through ``recv``/``send`` at all:
a pump (:mod:`libegress.tls_pump`) moves it with this class's one-step calls
(``decrypt_into``, ``feed``, ``encrypt``) and the sockets themselves, in a
thread that its owner always ends before the exchange returns, so before any
socket is closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import ssl
import threading
from typing import Protocol, cast

READ_SIZE = 256 * 1024  # a plain stream's read, and the most a TLS read returns
FLOOR = 64 * 1024  # a TLS stream's buffers start here and grow to READ_SIZE while reads fill them
OFFLOAD = 64 * 1024  # TLS work on this many bytes or more runs in CRYPTO


class Reused:
    """A read buffer reused across reads, sized to the traffic.

    It doubles (to READ_SIZE) while reads fill it, so a bulk transfer moves
    in few, large steps (each step costs the loop a fixed amount of Python),
    and falls back to FLOOR after a short read, so an idle or chatty
    connection holds little.  (Larger steps than READ_SIZE were measured: no
    faster on two cores, and 1 MiB ones grew a 1 GiB upload's peak RSS by
    13 MiB.)
    """

    def __init__(self) -> None:
        self._buf: bytearray | None = None
        self._size = FLOOR

    def view(self) -> memoryview:
        """The whole buffer (valid until the next :meth:`used`)."""
        if self._buf is None or len(self._buf) != self._size:
            self._buf = bytearray(self._size)
        return memoryview(self._buf)

    def used(self, n: int) -> None:
        """A read put ``n`` bytes in it: size the next one."""
        if n >= self._size:
            self._size = min(self._size * 2, READ_SIZE)
        elif n < FLOOR // 2 and self._size > FLOOR:
            self._size = FLOOR
            self._buf = None


class _Crypto:
    """The process's TLS worker pool, started on first use."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="egress-tls")
        return self._pool


CRYPTO = _Crypto()


class Stream(Protocol):
    """What the HTTP code needs from a connection."""

    async def recv(self) -> bytes:
        """Some bytes, or b"" at the end of the stream."""
        ...

    async def send(self, data: bytes) -> None:
        """All of ``data``."""
        ...

    async def shutdown(self) -> None:
        """End the sending side gracefully (TLS close_notify, TCP FIN)."""
        ...


class SocketStream:
    """A non-blocking TCP socket driven by the running loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        # A request body and its response move at the same time, in two tasks:
        # the locks keep each direction's bytes in order.
        self.send_lock = asyncio.Lock()
        self.recv_lock = asyncio.Lock()
        self._scratch = Reused()

    async def recv(self) -> bytes:
        async with self.recv_lock:
            return await self.loop.sock_recv(self.sock, READ_SIZE)

    async def recv_scratch(self) -> memoryview:
        """Some bytes in a buffer this stream reuses: valid until its next call.

        For TLS, whose BIO copies them at once: no fresh READ_SIZE object (and
        its page faults) per read.
        """
        async with self.recv_lock:
            view = self._scratch.view()
            n = await self.loop.sock_recv_into(self.sock, view)
            self._scratch.used(n)
        return view[:n]

    async def send(self, data: bytes) -> None:
        if data:
            async with self.send_lock:
                await self.loop.sock_sendall(self.sock, data)

    async def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


class TlsStream:
    """TLS over a :class:`SocketStream`, via ``ssl.SSLObject`` and memory BIOs."""

    def __init__(self, raw: SocketStream, obj: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        self.raw = raw
        self._obj = obj
        self._in = incoming
        self._out = outgoing
        self._plain = Reused()  # decrypted records land here first
        # The SSL object and its BIOs are entered by one thread at a time: the
        # loop's, or a CRYPTO worker's.
        self._lock = threading.Lock()
        # The read under way, kept across a cancelled recv() (a timeout) so no
        # decrypted byte is lost, and started ahead after a large read.
        self._ahead: asyncio.Future[bytes] | None = None
        self._waiting = 0  # recv() calls awaiting it
        self._shut = False
        # False while a pump is about to take this stream's reads (or has them):
        # recv() then starts no read ahead.
        self.read_ahead = True

    @classmethod
    async def server(cls, raw: SocketStream, ctx: ssl.SSLContext, early: bytes) -> TlsStream:
        """Accept a TLS client; ``early`` are bytes already read from it."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        if early:
            incoming.write(early)
        stream = cls(raw, ctx.wrap_bio(incoming, outgoing, server_side=True), incoming, outgoing)
        await stream._handshake()
        return stream

    @classmethod
    async def client(cls, raw: SocketStream, ctx: ssl.SSLContext, host: str) -> TlsStream:
        """Connect as a TLS client verifying ``host``."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname=host)
        stream = cls(raw, obj, incoming, outgoing)
        await stream._handshake()
        return stream

    async def _flush(self) -> None:
        with self._lock:
            if not self._out.pending:
                # Nothing to send: a reader never waits for the send lock, which a
                # send holds while its peer is slow to read (and that peer may be
                # waiting for this reader: both directions full would deadlock).
                return
        # Reading the BIO and sending under one lock keeps TLS records in order.
        async with self.raw.send_lock:
            with self._lock:
                pending = self._out.read() if self._out.pending else b""
            if pending:
                await self.raw.loop.sock_sendall(self.raw.sock, pending)

    async def _fill(self) -> bool:
        with await self.raw.recv_scratch() as data, self._lock:
            if data:
                self._in.write(data)
                return True
            self._in.write_eof()
        return False

    async def _handshake(self) -> None:
        while True:
            try:
                with self._lock:
                    self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionResetError("the peer closed during the TLS handshake") from None
        await self._flush()

    def _read_records(self) -> bytes:
        """Every decrypted byte ready now, up to READ_SIZE (one read is one record).

        The records are decrypted straight into one reused buffer: a fresh
        READ_SIZE object per 16 KiB record, then joined, cost bodies a third of
        their speed.  Runs on the loop or in CRYPTO, under ``_lock``.
        """
        total = 0
        with self._lock, self._plain.view() as view:
            size = len(view)
            try:
                while total < size:
                    # With a buffer, read() returns a count (typeshed says bytes).
                    n = cast(int, self._obj.read(size - total, view[total:]))
                    if not n:
                        break
                    total += n
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                if not total:
                    raise
            data = bytes(view[:total])
        self._plain.used(total)
        return data

    async def _decrypt(self) -> bytes:
        if self._in.pending >= OFFLOAD:
            return await self.raw.loop.run_in_executor(CRYPTO.pool(), self._read_records)
        return self._read_records()

    async def _recv(self) -> bytes:
        while True:
            try:
                return await self._decrypt()
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    # An EOF without close_notify: report the end all the same;
                    # HTTP framing decides whether the body was whole.
                    with contextlib.suppress(ssl.SSLError), self._lock:
                        return self._obj.read(READ_SIZE)
                    return b""
            except ssl.SSLZeroReturnError:
                return b""

    async def recv(self) -> bytes:
        if self._ahead is None:
            self._ahead = asyncio.ensure_future(self._recv())
        # Shielded: a caller's timeout leaves the read running for the next call.
        self._waiting += 1
        try:
            data = await asyncio.shield(self._ahead)
        finally:
            self._waiting -= 1
        self._ahead = None
        if len(data) >= OFFLOAD and self.read_ahead and not self._shut:
            # A bulk transfer: decrypt the next piece while this one is relayed.
            self._ahead = asyncio.ensure_future(self._recv())
        return data

    def _encrypt(self, view: memoryview) -> tuple[bytes, int]:
        """TLS records for as much of ``view`` as the SSL object takes, and that count.

        Runs on the loop or in CRYPTO, under ``_lock``; stops early only when
        the SSL object must read first (SSLWantReadError).
        """
        done = 0
        with self._lock:
            try:
                while done < len(view):
                    done += self._obj.write(view[done:done + READ_SIZE])
            except ssl.SSLWantReadError:
                if not done:
                    raise
            return self._out.read(), done

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        loop = self.raw.loop
        while view:
            piece = view[:4 * READ_SIZE]
            try:
                # Encrypted and sent under the send lock: records leave in order.
                async with self.raw.send_lock:
                    if len(piece) >= OFFLOAD:
                        records, done = await loop.run_in_executor(
                            CRYPTO.pool(), self._encrypt, piece)
                    else:
                        records, done = self._encrypt(piece)
                    await loop.sock_sendall(self.raw.sock, records)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionResetError("the peer closed the TLS stream") from None
                continue
            view = view[done:]
        await self._flush()

    def reads_idle(self) -> bool:
        """Whether no read is under way (none ahead, none awaited): a pump may read."""
        return self._ahead is None and not self._waiting

    # -- one step each, for a pump in a thread of its own (libegress.tls_pump) ----------

    def decrypt_into(self, view: memoryview) -> int:
        """Plaintext ready now into ``view``, every record that fits; 0 at the TLS end.

        SSLWantReadError when no record is whole yet.  Never more than
        ``len(view)``: what follows stays in the SSL object.
        """
        total = 0
        with self._lock:
            try:
                while total < len(view):
                    # With a buffer, read() returns a count (typeshed says bytes);
                    # 0 after the peer's close_notify.
                    n = cast(int, self._obj.read(len(view) - total, view[total:]))
                    if not n:
                        break
                    total += n
            except ssl.SSLZeroReturnError:
                pass
            except ssl.SSLWantReadError:
                if not total:
                    raise
        return total

    def feed(self, ciphertext: memoryview) -> None:
        """Bytes read from the socket, for :meth:`decrypt_into`."""
        with self._lock:
            self._in.write(ciphertext)

    def encrypt(self, view: memoryview) -> bytes:
        """TLS records for all of ``view``, after any the SSL object had pending."""
        with self._lock:
            done = 0
            try:
                while done < len(view):
                    done += self._obj.write(view[done:])
            except ssl.SSLWantReadError:  # a renegotiation: never mid-body here
                raise ssl.SSLError("the peer renegotiated inside a body") from None
            return self._out.read()

    async def shutdown(self) -> None:
        """End the sending side (close_notify, FIN), when the connection ends.

        A read nobody waits for (ahead, or left by a timed-out recv()) ends
        here, with whatever it had read, and none starts after: the stream's
        owner shuts it down as the connection ends, so no read outlives it.
        A recv() under way meanwhile goes on.
        """
        self._shut = True
        if not self._waiting:
            await self._stop_reading()
        with contextlib.suppress(ssl.SSLError, OSError), self._lock:
            self._obj.unwrap()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self._flush()
        await self.raw.shutdown()

    async def _stop_reading(self) -> None:
        """End a read under way (ahead or abandoned); a CRYPTO job in it runs out first."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()  # a no-op once it is done; awaiting it then retrieves its error
            with contextlib.suppress(BaseException):
                await ahead
