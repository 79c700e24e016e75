"""Raw tunnels: bytes move socket to socket inside the kernel.

Each direction owns a pipe; ``os.splice`` moves data socket -> pipe -> socket
without it ever reaching Python.  The pumps are callbacks on the loop's
selector (no task switch per chunk): the source is watched while the pipe has
room, the destination while the pipe holds data.  The pipe is created when the
first byte arrives, so an idle tunnel holds only its two sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket


def set_pipe_size(fd: int, size: int) -> None:
    """Grow the pipe behind ``fd``; harmless if refused (the per-user pipe quota).

    libbroker has the same three lines; libegress keeps its own rather than
    reach into the broker's layer (docs/LAYOUT.md: only libbroker's base is shared).
    """
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)


PIPE_SIZE = 1 << 20
CHUNK = 1 << 20
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class _Pump:
    """One direction of a tunnel: ``src`` to ``dst`` until EOF or error."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket,
                 dst: socket.socket) -> None:
        self.loop = loop
        self.src = src.fileno()
        self.dst = dst.fileno()
        self.dst_sock = dst
        self.done: asyncio.Future[int] = loop.create_future()
        self.moved = 0
        self._pipe: tuple[int, int] | None = None
        self._held = 0
        self._eof = False
        self._reading = False
        self._writing = False

    def start(self) -> None:
        self._watch(read=True, write=False)

    def _ensure_pipe(self) -> tuple[int, int]:
        if self._pipe is None:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            set_pipe_size(w, PIPE_SIZE)
            self._pipe = (r, w)
        return self._pipe

    def _on_readable(self) -> None:
        try:
            _, w = self._ensure_pipe()
            while True:
                try:
                    n = os.splice(self.src, w, CHUNK, flags=_FLAGS)
                except BlockingIOError:
                    # Either the socket is drained or the pipe is full.
                    break
                if n == 0:
                    self._eof = True
                    self._watch(read=False, write=self._writing)
                    break
                self._held += n
                if self._held >= PIPE_SIZE:
                    break
            self._drain()
        except OSError as exc:
            self._finish(exc)

    def _on_writable(self) -> None:
        try:
            self._drain()
        except OSError as exc:
            self._finish(exc)

    def _drain(self) -> None:
        if self._held and self._pipe is not None:
            r, _ = self._pipe
            while self._held:
                try:
                    n = os.splice(r, self.dst, self._held, flags=_FLAGS)
                except BlockingIOError:
                    break
                self._held -= n
                self.moved += n
        if self._held:
            # The destination is full: stop reading until it drains.
            self._watch(read=False, write=True)
            return
        if self._eof:
            with contextlib.suppress(OSError):
                self.dst_sock.shutdown(socket.SHUT_WR)
            self._finish(None)
        else:
            self._watch(read=True, write=False)

    def _watch(self, read: bool, write: bool) -> None:
        if read != self._reading:
            if read:
                self.loop.add_reader(self.src, self._on_readable)
            else:
                self.loop.remove_reader(self.src)
            self._reading = read
        if write != self._writing:
            if write:
                self.loop.add_writer(self.dst, self._on_writable)
            else:
                self.loop.remove_writer(self.dst)
            self._writing = write

    def _finish(self, exc: OSError | None) -> None:
        self.stop()
        if not self.done.done():
            if exc is None:
                self.done.set_result(self.moved)
            else:
                # A reset or any other error ends the whole tunnel.
                self.done.set_exception(exc)

    def stop(self) -> None:
        """Unregister and release the pipe; the sockets belong to the caller."""
        self._watch(read=False, write=False)
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None


async def relay(client: socket.socket, upstream: socket.socket) -> tuple[int, int]:
    """Move bytes both ways until both directions end; (up, down) byte counts.

    A direction ending with EOF half-closes the other side; an error ends both.
    The caller closes the sockets.
    """
    loop = asyncio.get_running_loop()
    up = _Pump(loop, client, upstream)
    down = _Pump(loop, upstream, client)
    up.start()
    down.start()
    try:
        pending: set[asyncio.Future[int]] = {up.done, down.done}
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in finished:
                if fut.exception() is not None:
                    return up.moved, down.moved
        return up.moved, down.moved
    finally:
        up.stop()
        down.stop()
