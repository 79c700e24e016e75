"""A known number of plaintext bytes moved from one TLS stream to another by a thread.

The inject path decrypts every body byte from one side and encrypts it for the
other.  Done on the event loop (:class:`~libegress.streams.TlsStream`'s
``recv``/``send``, h11 between them), each 256 KiB step cost several Python
frames, memory copies and thread hand-offs: 0.26-0.41x of a direct transfer
on two cores, about 1.1 s of the proxy's CPU per 256 MiB.  A :class:`Pump`
moves the bytes of one Content-Length body in a thread of its own, in a tight
loop: read the source socket, decrypt, encrypt, send.  OpenSSL and the
socket calls release the GIL, so a download's pump, an upload's pump and the
loop run on both cores.

What the pump may touch, and why that is safe:

- the source's socket for reading and the sink's socket for writing.  Its
  owner (:mod:`libegress.bulk_body`) holds the source's receive lock and the
  sink's send lock (asyncio locks) for the pump's whole life, and starts it
  only when no read of the source is under way, so no task reads or writes
  those directions meanwhile.  The sockets stay open and owned by the loop;
  the pump never closes one;
- each SSL object and its BIOs only through the stream's one-step calls
  (``decrypt_into``, ``feed``, ``encrypt``), each under that stream's lock,
  as the loop and the CRYPTO workers enter it; never two such locks at once;
- exactly ``count`` plaintext bytes: decryption asks for no more than are
  left, so what follows the body (a pipelined request) stays in the SSL
  object for the HTTP code.

A chunked body's data goes the same way through a :class:`ChunkedPump`,
which reads the framing with :class:`~libegress.chunks.ChunkScan` (decrypting
past where it stops: those bytes are handed back to h11, with its state) and
sends each step's data as one chunk, framed into a buffer it reuses.

A pump ends after ``count`` bytes (a chunked one, where its scan stops);
early, returning what it moved, when the source ends (EOF, close_notify: the
caller's HTTP code then reads the end and says what is wrong, as without a
pump); with :class:`Stalled` when no whole TLS record comes from the source
for ``timeout`` seconds; with the socket's or TLS's error; and with
:class:`Stopped` when its owner, cancelled, asks it to (an eventfd in every
wait).  :meth:`Pump.run` returns only once the thread has ended, on every
path: no thread outlives its exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import ssl
import threading
import time

from libegress.chunks import FRAMING, HEADER_MAX, ChunkScan, framed_into
from libegress.streams import READ_SIZE, TlsStream

STEP = READ_SIZE  # the most plaintext decrypted before it is encrypted and sent
_WAKE = select.POLLIN | select.POLLERR | select.POLLHUP


class Stalled(Exception):
    """The source sent nothing within the timeout."""


class Stopped(Exception):
    """The pump's owner asked it to end."""


class Pump:
    """``count`` plaintext bytes from ``src`` to ``dst``; ``moved`` says how many went."""

    def __init__(self, src: TlsStream, dst: TlsStream, count: int, timeout: float) -> None:
        self.src, self.dst = src, dst
        self.count = count
        self.timeout = timeout
        self.moved = 0
        self._stop = -1

    async def run(self) -> int:
        """Move the bytes in a thread of its own; the count moved (less at the source's end)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._stop = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        thread = threading.Thread(target=self._thread, args=(loop, done), name="egress-pump",
                                  daemon=True)
        try:
            thread.start()
            try:
                return await asyncio.shield(done)
            except asyncio.CancelledError:
                os.eventfd_write(self._stop, 1)
                await _ended(done)
                raise
        finally:
            if thread.ident is not None:
                thread.join()  # at once: settling ``done`` is the thread's last act
            os.close(self._stop)

    def _thread(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[int]) -> None:
        try:
            result: int | BaseException = self._move()
        except BaseException as exc:  # handed to the owner, which re-raises it
            result = exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, result)

    def _move(self) -> int:
        plain = memoryview(bytearray(min(STEP, self.count)))
        cipher = memoryview(bytearray(STEP))
        readable, writable = self._pollers()
        while self.moved < self.count:
            n = self._decrypt(plain[:self.count - self.moved], cipher, readable)
            if not n:
                break  # the source ended: the caller's HTTP code reads that end
            self._send(plain[:n], writable)
            self.moved += n
        return self.moved

    def _pollers(self) -> tuple[select.poll, select.poll]:
        readable, writable = select.poll(), select.poll()
        readable.register(self.src.raw.sock.fileno(), _WAKE)
        writable.register(self.dst.raw.sock.fileno(), select.POLLOUT)
        for poller in (readable, writable):
            poller.register(self._stop, select.POLLIN)
        return readable, writable

    def _decrypt(self, into: memoryview, cipher: memoryview, readable: select.poll) -> int:
        """Plaintext into ``into`` (every record ready, at least one); 0 at the source's end.

        The timeout runs until a whole record is in, as for the ordinary
        path's read: a peer trickling ciphertext that never completes one
        stalls all the same.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.src.decrypt_into(into)
            except ssl.SSLWantReadError:
                pass
            if not self._fill(cipher, readable, deadline):
                return 0

    def _fill(self, cipher: memoryview, readable: select.poll, deadline: float) -> bool:
        """Ciphertext from the source's socket into its BIO; False at its end."""
        sock = self.src.raw.sock
        while True:
            try:
                n = sock.recv_into(cipher)
                break
            except (BlockingIOError, InterruptedError):
                self._wait(readable, max(deadline - time.monotonic(), 0.0))
        if n:
            self.src.feed(cipher[:n])
        return bool(n)

    def _send(self, plain: memoryview, writable: select.poll) -> None:
        records = memoryview(self.dst.encrypt(plain))
        sock = self.dst.raw.sock
        while records:
            try:
                records = records[sock.send(records):]
            except (BlockingIOError, InterruptedError):
                self._wait(writable, None)

    def _wait(self, poller: select.poll, timeout: float | None) -> None:
        ready = poller.poll(None if timeout is None else int(timeout * 1000) + 1)
        if not ready:
            raise Stalled
        if any(fd == self._stop for fd, _ in ready):
            raise Stopped


class ChunkedPump(Pump):
    """A chunked body's data from ``src`` to ``dst``, as far as ``scan`` reads it.

    Each step's data goes out as one chunk, framed as h11 frames one (chunk
    boundaries are hop-by-hop).  It ends where ``scan`` stops (the last chunk,
    or anything only h11 reads) or where the source ends; ``rest`` is then
    what it decrypted and did not read, for h11, and ``scan`` h11's state.
    ``moved`` counts data bytes.
    """

    def __init__(self, src: TlsStream, dst: TlsStream, scan: ChunkScan, timeout: float) -> None:
        super().__init__(src, dst, 0, timeout)
        self.scan = scan
        self.rest = b""

    def _move(self) -> int:
        plain = memoryview(bytearray(STEP + HEADER_MAX))
        chunk = memoryview(bytearray(STEP + HEADER_MAX + FRAMING))  # each step's, reused
        cipher = memoryview(bytearray(STEP))
        readable, writable = self._pollers()
        held = 0  # a chunk header not yet whole, at plain[:held]
        while True:
            n = self._decrypt(plain[held:], cipher, readable)
            end = held + n
            if not n:  # the source ended: h11 gets the header begun, then reads that end
                self.rest = bytes(plain[:held])
                return self.moved
            spans: list[tuple[int, int]] = []
            read = self.scan.scan(plain, 0, end, spans)
            if spans:
                size, data = framed_into(chunk, plain, spans)
                self._send(chunk[:size], writable)
                self.moved += data
            if self.scan.stopped:
                self.rest = bytes(plain[read:end])
                return self.moved
            held = end - read
            plain[:held] = plain[read:end]


def _settle(done: asyncio.Future[int], result: int | BaseException) -> None:
    if done.done():
        return
    if isinstance(result, BaseException):
        done.set_exception(result)
    else:
        done.set_result(result)


async def _ended(done: asyncio.Future[int]) -> None:
    """Wait for the thread's end, through further cancellations; its outcome is dropped."""
    while not done.done():
        with contextlib.suppress(BaseException):
            await asyncio.shield(done)
    if not done.cancelled():
        done.exception()  # retrieved: no "never retrieved" warning
