"""One connection to the resident service, on the service's side: lines with descriptors.

asyncio's streams cannot carry ``SCM_RIGHTS``, and a session hands the service
the pipes of its broker that way (:mod:`.broker_zygote`).  So the service reads
each connection itself: JSON lines, each with the descriptors that came with
it (at most :data:`MAX_FDS`; more, or descriptors where none are expected, are
closed and refused by the caller).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
from collections.abc import Callable

MAX_LINE = 1 << 20
MAX_FDS = 4


class Closed(Exception):
    """The peer closed the connection (or it failed)."""


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._buf = b""
        self._fds: list[int] = []

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = self.sock.fileno()
        loop.add_reader(fd, _waker(ready))
        try:
            await ready
        finally:
            loop.remove_reader(fd)

    async def line(self) -> tuple[bytes, list[int]]:
        """The next line (without its newline) and the descriptors that came with it."""
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise ValueError("request line over the limit")
            await self._readable()
            try:
                data, anc, _, _ = self.sock.recvmsg(
                    65536, socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise Closed(str(exc)) from None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                    self._fds += list(got)
            if not data:
                raise Closed("end of file")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        fds, self._fds = self._fds, []
        return line, fds

    def send(self, data: bytes, fds: list[int] | None = None) -> None:
        """One reply (small: it fits the socket's buffer), with ``fds`` if given."""
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.sock.setblocking(True)
        try:
            self.sock.sendmsg([data], anc)
        finally:
            self.sock.setblocking(False)

    async def closed(self) -> None:
        """Until the peer closes the connection or sends anything more."""
        with contextlib.suppress(OSError):
            while True:
                await self._readable()
                try:
                    self.sock.recv(1)
                except BlockingIOError:
                    continue
                return

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        self.sock.close()


def _waker(ready: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    return wake
