"""What goes to the client on a broker connection: the command's output as frames, then the end.

Part of :class:`libbroker.broker.connection.Connection` (its base).  Bulk data
never passes through Python: an output frame is its 5-byte header followed by
``splice(pipe -> socket)`` of exactly the bytes the pipe holds (FIONREAD).
When a splice moves less than a whole frame, the rest is copied and queued,
so frames are never interleaved.  Backpressure is plain: the output pipes are
not read while anything is queued for the client.  Once all is said, our side
is shut and the client gets a little while to hang up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from libbroker.broker.pipes import SPLICE_FLAGS, available, read_exact
from libbroker.wire import HEADER_SIZE, MAX_PAYLOAD, frame_header

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libbroker.broker.connection import Settings

LINGER = 5.0  # how long a finished connection waits for the client to hang up


class ToClient:
    """The writing side of a connection (the state is set by ``Connection.__init__``)."""

    s: Settings
    loop: asyncio.AbstractEventLoop
    sock: socket.socket
    fd: int
    closed: bool
    ending: bool  # HalfClose came: nothing more from the command, nor the client
    half_closed: bool
    outq: list[bytes]
    writing: bool
    outputs: dict[int, int]  # the command's output pipes: fd -> channel
    outputs_on: bool
    timers: list[asyncio.TimerHandle]

    # What the connection brings (libbroker.broker.connection.Connection).
    def _client_gone(self) -> None:
        raise NotImplementedError

    def _internal_error(self, exc: Exception) -> None:
        raise NotImplementedError

    def _read_socket(self, on: bool) -> None:
        raise NotImplementedError

    def _close_socket(self) -> None:
        raise NotImplementedError

    def _read_outputs(self, on: bool) -> None:
        if on == self.outputs_on:
            return
        for fd, channel in self.outputs.items():
            if on:
                self.loop.add_reader(fd, self._on_output, fd, channel)
            else:
                self.loop.remove_reader(fd)
        self.outputs_on = on

    def _on_output(self, fd: int, channel: int) -> None:
        try:
            self._output_frame(fd, channel)
        except Exception as exc:  # end this connection, not the server
            self._internal_error(exc)

    def _output_frame(self, fd: int, channel: int) -> None:
        """One frame from a pipe: header sent, payload spliced; the rest queued."""
        count = min(available(fd), MAX_PAYLOAD) if self.s.splice else 0
        if not count:
            self._copy_output(fd, channel)  # EOF, or a spurious wake-up
            return
        header = frame_header(channel, count)
        try:
            sent = self.sock.send(header)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._client_gone()
            return
        if sent < HEADER_SIZE:
            self._queue(header[sent:], read_exact(fd, count))
            return
        try:
            moved = os.splice(fd, self.fd, count, flags=SPLICE_FLAGS)
        except BlockingIOError:
            moved = 0
        except (BrokenPipeError, ConnectionResetError):
            self._client_gone()
            return
        except OSError:
            self.s.splice = False  # not supported here: copy from now on
            moved = 0
        if moved < count:
            self._queue(read_exact(fd, count - moved))

    def _copy_output(self, fd: int, channel: int) -> bool:
        """Read and queue what the pipe holds; False at EOF or when it is empty."""
        try:
            data = os.read(fd, MAX_PAYLOAD)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._close_output(fd)
            return False
        self._queue(frame_header(channel, len(data)), data)
        return True

    def _close_output(self, fd: int) -> None:
        if self.outputs_on:
            self.loop.remove_reader(fd)
        del self.outputs[fd]
        os.close(fd)

    def _queue(self, *parts: bytes) -> None:
        if self.closed:
            return
        self.outq.extend(parts)
        self._flush()

    def _on_writable(self) -> None:
        try:
            self._flush()
        except Exception as exc:  # end this connection, not the server
            self._internal_error(exc)

    def _flush(self) -> None:
        if self.closed:
            return
        while self.outq:
            try:
                sent = self.sock.sendmsg(self.outq[:64])
            except BlockingIOError:
                break
            except OSError:
                self._client_gone()
                return
            while sent:
                head = self.outq[0]
                if sent >= len(head):
                    sent -= len(head)
                    self.outq.pop(0)
                else:
                    self.outq[0] = head[sent:]
                    sent = 0
        if self.outq:
            self._read_outputs(False)  # nothing more from the command until this is sent
            if not self.writing:
                self.loop.add_writer(self.fd, self._on_writable)
                self.writing = True
            return
        if self.writing:
            self.loop.remove_writer(self.fd)
            self.writing = False
        if self.ending:
            self._half_close()
        else:
            self._read_outputs(True)

    def _half_close(self) -> None:
        """All said: shut our side and wait (briefly) for the client to hang up."""
        if self.half_closed or self.closed:
            return
        self.half_closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self._read_socket(True)
        self.timers.append(self.loop.call_later(LINGER, self._close_socket))
