"""The client side of the broker protocol: one request, frames both ways.

Used by broker-client and gpg-shim, so it imports only the standard library
and :mod:`libbroker.wire`: every import here is paid on every call.

The I/O loop is a single ``poll`` over the socket, stdin and a signal wake-up
pipe, never a blocking read of stdin.  That is what lets
``tail -f x | broker-client -- grep -m1 y`` end as soon as grep ends: the exit
frame is acted on at once, whatever stdin is doing.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
from collections.abc import Iterable

from libbroker.errors import BrokerUnavailable, ProtocolError, RequestRefused
from libbroker.wire import (
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    SOCKET_ENV_VAR,
    Channel,
    FrameDecoder,
    Request,
    decode_error,
    decode_exit,
    encode_request,
    encode_signal,
    encode_stdin_eof,
    frame_header,
)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_READ_SIZE = MAX_PAYLOAD
_SEND_BACKLOG = 4 * MAX_PAYLOAD  # stop reading stdin while this much waits to be sent
_POLL_IN = select.POLLIN | select.POLLPRI
_POLL_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def socket_path(explicit: str | None = None) -> str:
    """The broker socket: ``explicit`` (``--socket``) or the environment."""
    path = explicit or os.environ.get(SOCKET_ENV_VAR, "")
    if not path:
        raise BrokerUnavailable(
            f"no broker socket: set {SOCKET_ENV_VAR} or pass --socket "
            "(are you inside an agent-sandbox session?)"
        )
    return path


def connect(path: str) -> socket.socket:
    """A connected socket to the broker at ``path``, or BrokerUnavailable."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        raise BrokerUnavailable(
            f"broker socket {path} does not exist: is broker-server running?"
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise BrokerUnavailable(f"no broker is listening on {path}: restart the session") from None
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise BrokerUnavailable(f"cannot reach the broker at {path}: {reason}") from None
    return sock


def call(
    request: Request,
    *,
    path: str | None = None,
    stdin_fd: int | None = 0,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
    forward_signals: Iterable[int] = FORWARDED_SIGNALS,
) -> int:
    """Send ``request`` and run the exchange to its end; return the exit status.

    Stdin is pumped from ``stdin_fd`` when ``request.with_stdin`` is set;
    stdout and stderr frames go to their fds.  Raises BrokerUnavailable when
    the broker cannot be reached or goes away, RequestRefused for an error
    frame, and BrokenPipeError when ``stdout_fd`` is closed by its reader (the
    connection is closed first, which makes the server end the command).
    """
    sock = connect(socket_path(path))
    with sock:
        try:
            sock.sendall(encode_request(request))
        except OSError as exc:
            raise BrokerUnavailable(f"the broker closed the connection: {exc.strerror}") from None
        pump = stdin_fd if request.with_stdin else None
        return _Exchange(sock, pump, stdout_fd, stderr_fd).run(tuple(forward_signals))


def ping(path: str | None = None) -> None:
    """Check that a broker answers; raise BrokerUnavailable otherwise."""
    status = call(Request((), "/", with_stdin=False, op="ping"), path=path, forward_signals=())
    if status != 0:
        raise BrokerUnavailable(f"the broker answered ping with status {status}")


class _Exchange:
    """One connection's poll loop; owns nothing but the buffers it fills."""

    def __init__(self, sock: socket.socket, stdin_fd: int | None, out_fd: int, err_fd: int):
        self.sock = sock
        self.stdin_fd = stdin_fd
        self.fds = {Channel.STDOUT: out_fd, Channel.STDERR: err_fd}
        self.outgoing: list[bytes] = []
        self.outgoing_size = 0
        self.decoder = FrameDecoder(accept=SERVER_CHANNELS)

    def run(self, signals: tuple[int, ...]) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = {}
        old_wakeup = -1
        try:
            if signals:
                old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
                for signum in signals:
                    previous[signum] = signal.signal(signum, _note_signal)
            self.sock.setblocking(False)
            return self._loop(wake_r)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if signals:
                signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)

    def _loop(self, wake_fd: int) -> int:
        poller = select.poll()
        sock_fd = self.sock.fileno()
        poller.register(wake_fd, _POLL_IN)
        stdin_on = False
        while True:
            want_stdin = self.stdin_fd is not None and self.outgoing_size < _SEND_BACKLOG
            if want_stdin != stdin_on and self.stdin_fd is not None:
                if want_stdin:
                    poller.register(self.stdin_fd, _POLL_IN)
                else:
                    poller.unregister(self.stdin_fd)
                stdin_on = want_stdin
            poller.register(sock_fd, _POLL_IN | (select.POLLOUT if self.outgoing else 0))
            for fd, events in poller.poll():
                if fd == sock_fd:
                    if events & (_POLL_IN | _POLL_GONE):
                        status = self._receive()
                        if status is not None:
                            return status
                    if events & select.POLLOUT:
                        self._flush()
                elif fd == wake_fd:
                    for signum in _drain(wake_fd):
                        if 0 < signum < 256:
                            self._queue(encode_signal(signum))
                    self._flush()
                elif fd == self.stdin_fd and stdin_on:
                    self._read_stdin()
                    if self.stdin_fd is None:
                        poller.unregister(fd)
                        stdin_on = False

    def _receive(self) -> int | None:
        try:
            data = self.sock.recv(_READ_SIZE + 5)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise BrokerUnavailable(f"lost the broker connection: {exc.strerror}") from None
        if not data:
            raise BrokerUnavailable("the broker closed the connection without an exit status")
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as exc:
            raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None
        for channel, payload in frames:
            if channel is Channel.EXIT:
                try:
                    return decode_exit(payload) & 0xFF
                except ProtocolError as exc:
                    raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None
            if channel is Channel.ERROR:
                raise RequestRefused(decode_error(payload))
            _write_all(self.fds[channel], payload)
        return None

    def _read_stdin(self) -> None:
        assert self.stdin_fd is not None
        try:
            data = os.read(self.stdin_fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # a closed or unreadable stdin is an empty one
        if data:
            self._queue(frame_header(Channel.STDIN, len(data)), data)
        else:
            self._queue(encode_stdin_eof())
            self.stdin_fd = None
        self._flush()

    def _queue(self, *parts: bytes) -> None:
        self.outgoing.extend(parts)
        self.outgoing_size += sum(len(p) for p in parts)

    def _flush(self) -> None:
        while self.outgoing:
            try:
                sent = self.sock.sendmsg(self.outgoing[:64])
            except BlockingIOError:
                return
            except OSError:
                # The server went away; its exit or error frame may still be
                # readable, so stop sending and let the read side decide.
                self.outgoing.clear()
                self.outgoing_size = 0
                self.stdin_fd = None
                return
            self.outgoing_size -= sent
            while sent:
                head = self.outgoing[0]
                if sent >= len(head):
                    sent -= len(head)
                    self.outgoing.pop(0)
                else:
                    self.outgoing[0] = head[sent:]
                    sent = 0


def _note_signal(signum: int, frame: object) -> None:
    """The wake-up fd carries the signal number; nothing else to do here."""


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 512)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            # A non-blocking fd shared with someone else: wait until writable.
            select.select([], [fd], [])
            continue
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise BrokenPipeError(errno.EPIPE, "output closed") from None
            raise
        view = view[written:]
