"""Byte streams over non-blocking sockets: plain, and TLS through memory BIOs.

The proxy keeps raw sockets (not asyncio transports) so that a CONNECT tunnel
can hand both file descriptors to the kernel (:mod:`libegress.splice`).  TLS is
done with ``ssl.SSLObject`` over memory BIOs: the TLS state machine stays pure,
and the reads and writes are this module's ``sock_recv``/``sock_sendall``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Protocol, cast

READ_SIZE = 256 * 1024


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
        self._recv_lock = asyncio.Lock()
        self._scratch: bytearray | None = None

    async def recv(self) -> bytes:
        async with self._recv_lock:
            return await self.loop.sock_recv(self.sock, READ_SIZE)

    async def recv_scratch(self) -> memoryview:
        """Some bytes in a buffer this stream reuses: valid until its next call.

        For TLS, whose BIO copies them at once: no fresh READ_SIZE object (and
        its page faults) per read.
        """
        if self._scratch is None:
            self._scratch = bytearray(READ_SIZE)
        async with self._recv_lock:
            n = await self.loop.sock_recv_into(self.sock, self._scratch)
        return memoryview(self._scratch)[:n]

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
        self._plain = bytearray(READ_SIZE)  # decrypted records land here first

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
        # Reading the BIO and sending under one lock keeps TLS records in order.
        async with self.raw.send_lock:
            if self._out.pending:
                await self.raw.loop.sock_sendall(self.raw.sock, self._out.read())

    async def _fill(self) -> bool:
        with await self.raw.recv_scratch() as data:
            if data:
                self._in.write(data)
                return True
        self._in.write_eof()
        return False

    async def _handshake(self) -> None:
        while True:
            try:
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
        their speed.
        """
        total = 0
        with memoryview(self._plain) as view:
            while total < READ_SIZE:
                try:
                    # With a buffer, read() returns a count (typeshed says bytes).
                    n = cast(int, self._obj.read(READ_SIZE - total, view[total:]))
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    if total:
                        break
                    raise
                if not n:
                    break
                total += n
            return bytes(view[:total])

    async def recv(self) -> bytes:
        while True:
            try:
                return self._read_records()
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    # An EOF without close_notify: report the end all the same;
                    # HTTP framing decides whether the body was whole.
                    with contextlib.suppress(ssl.SSLError):
                        return self._obj.read(READ_SIZE)
                    return b""
            except ssl.SSLZeroReturnError:
                return b""

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = self._obj.write(view[:READ_SIZE])
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionResetError("the peer closed the TLS stream") from None
                continue
            view = view[written:]
            if self._out.pending >= READ_SIZE:
                await self._flush()
        await self._flush()

    async def shutdown(self) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            self._obj.unwrap()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self._flush()
        await self.raw.shutdown()
