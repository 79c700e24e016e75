"""The client side of the broker protocol: one request, frames both ways.

Used by broker-client and gpg-shim, so it imports only the standard library
and :mod:`libbroker.wire` / :mod:`libbroker.broker.pipes`: every import here is paid
on every call.

The I/O loop is a single ``poll`` over the socket, stdin and a signal wake-up
pipe, never a blocking read of stdin.  That is what lets
``tail -f x | broker-client -- grep -m1 y`` end as soon as grep ends: the exit
frame is acted on at once, whatever stdin is doing.

Bulk data is spliced: a stdin pipe goes pipe -> socket (frames sized by
FIONREAD, header first), and output payloads go socket -> stdout when stdout
is a pipe, or socket -> a pipe of ours -> stdout when it is a file or
/dev/null.  Only a terminal (or similar) gets a copy through Python.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import stat
from collections.abc import Iterable

from libbroker.broker.dial import SOCKET_ENV_VAR, dial
from libbroker.broker.pipes import available, lazy_buffer, read_exact, set_pipe_size
from libbroker.errors import BrokerUnavailable, ProtocolError
from libbroker.wire import (
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    Channel,
    Data,
    Payload,
    Reader,
    Request,
    encode_request,
    encode_signal,
    encode_stdin_eof,
    final_status,
    frame_header,
)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_READ_SIZE = MAX_PAYLOAD
_BLOCKED = -1
_MORE = -2
_SEND_BACKLOG = 4 * MAX_PAYLOAD  # stop reading stdin while this much waits to be sent
_POLL_IN = select.POLLIN | select.POLLPRI
_POLL_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL
_OUTPUTS = frozenset({Channel.STDOUT, Channel.STDERR})


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
    # Whole frames per send for stdin (see connection.py).
    raw = dial(path, send_buffer=4 * MAX_PAYLOAD)
    return socket.socket(fileno=raw.detach())


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
        except OSError:
            # Refused at once (another uid, shutting down): its error frame
            # may already be waiting; the read side reports it.
            request = request.without_stdin()
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
        # The incoming stream, decoded by wire; stdout and stderr payloads are
        # announced, not buffered, and moved by us to ``output_fd``.
        self.reader = Reader(SERVER_CHANNELS, passthrough=_OUTPUTS)
        self.output_fd = out_fd
        # splice needs a pipe or file that blocks (a full non-blocking one would spin)
        self.splice_to = {fd: _spliceable(fd) for fd in (out_fd, err_fd)}
        # Files and /dev/null take splice from a pipe only: through one of ours.
        self.via_pipe = {fd: _file_like(fd) for fd in (out_fd, err_fd)}
        self.relay: tuple[int, int] | None = None
        self.splice_from = stdin_fd is not None and _spliceable(stdin_fd)
        # Made on first use: stdin reads and output that cannot be spliced.
        self._inbuf: memoryview | None = None
        self._outbuf: memoryview | None = None
        if stdin_fd is not None:
            # A bigger pipe behind us means bigger reads and fewer frames; a
            # non-pipe stdin just refuses (harmless).
            set_pipe_size(stdin_fd, _READ_SIZE)

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
            self.close()

    def _loop(self, wake_fd: int) -> int:
        poller = select.poll()
        sock_fd = self.sock.fileno()
        poller.register(wake_fd, _POLL_IN)
        registered_stdin: int | None = None
        while True:
            # Read stdin only while the server keeps up: memory stays bounded.
            want = self.stdin_fd if self.outgoing_size < _SEND_BACKLOG else None
            if want != registered_stdin:
                if registered_stdin is not None:
                    poller.unregister(registered_stdin)
                if want is not None:
                    poller.register(want, _POLL_IN)
                registered_stdin = want
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
                elif fd == registered_stdin and fd == self.stdin_fd:
                    self._read_stdin()

    def _receive(self) -> int | None:
        """Make progress on the incoming stream; the exit status once it arrives."""
        for _ in range(64):
            step = self._receive_step()
            if step == _BLOCKED:
                return None
            if step != _MORE:
                return step
        return None

    def _receive_step(self) -> int:
        """One read or one decoded event: stdout/stderr payloads are spliced
        from the socket to their fd, never copied through Python."""
        reader = self.reader
        try:
            if reader.passing:
                moved = self._pass_output(self.output_fd, reader.passing)
                if moved is None:
                    return _BLOCKED
                reader.passed(moved)
                return _MORE
            event = reader.next_event()
            if event is None:
                data = self._recv(reader.want())
                if data is None:
                    return _BLOCKED
                reader.feed(data)
                return _MORE
            if isinstance(event, Payload):
                self.output_fd = self.fds[event.channel]
            elif isinstance(event, Data):  # only if fed past a header, which we never do
                _write_all(self.fds[event.channel], event.data)
            else:
                status = final_status(event)
                if status is not None:
                    return status
        except ProtocolError as exc:
            raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None
        return _MORE

    def _pass_output(self, fd: int, count: int) -> int | None:
        """Move up to ``count`` payload bytes to ``fd``; None when the socket is empty."""
        if self.splice_to[fd]:
            try:
                moved = os.splice(self.sock.fileno(), fd, count, flags=os.SPLICE_F_MOVE)
            except BlockingIOError:
                return None
            except BrokenPipeError:
                raise
            except ConnectionResetError as exc:
                raise _lost(exc) from None
            except OSError:
                self.splice_to[fd] = False  # not spliceable after all: copy
                return 0
            if not moved:
                raise _closed()
            return moved
        if self.via_pipe[fd]:
            return self._relay_output(fd, count)
        # Into a reused buffer: a fresh bytes object per read costs page faults.
        view = self._output_buffer()[: min(count, _READ_SIZE)]
        try:
            count = self.sock.recv_into(view)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _lost(exc) from None
        if not count:
            raise _closed()
        _write_all(fd, view[:count])
        return count

    def _output_buffer(self) -> memoryview:
        if self._outbuf is None:
            self._outbuf = memoryview(lazy_buffer(_READ_SIZE))
        return self._outbuf

    def _input_buffer(self) -> memoryview:
        if self._inbuf is None:
            self._inbuf = memoryview(lazy_buffer(_READ_SIZE))
        return self._inbuf

    def _relay_output(self, fd: int, count: int) -> int | None:
        """socket -> our pipe -> ``fd``: two splices, no copy through user space."""
        if self.relay is None:
            self.relay = os.pipe2(os.O_CLOEXEC)
            set_pipe_size(self.relay[1], _READ_SIZE)
        r, w = self.relay
        try:
            moved = os.splice(self.sock.fileno(), w, min(count, _READ_SIZE),
                              flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)  # fmt: skip
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _lost(exc) from None
        if not moved:
            raise _closed()
        left = moved
        while left:
            try:
                left -= os.splice(r, fd, left, flags=os.SPLICE_F_MOVE)
            except BrokenPipeError:
                raise
            except OSError:
                # fd takes no splice after all (O_APPEND file, ...): copy from now on.
                self.via_pipe[fd] = False
                _write_all(fd, read_exact(r, left))
                left = 0
        return moved

    def close(self) -> None:
        if self.relay is not None:
            for end in self.relay:
                os.close(end)
            self.relay = None

    def _recv(self, count: int) -> bytes | None:
        try:
            data = self.sock.recv(count)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _lost(exc) from None
        if not data:
            raise _closed()
        return data

    def _read_stdin(self) -> None:
        assert self.stdin_fd is not None
        if self.splice_from and not self.outgoing:
            self._splice_stdin()
            return
        try:
            count = os.readv(self.stdin_fd, [self._input_buffer()])
        except BlockingIOError:
            return
        except OSError:
            count = 0  # a closed or unreadable stdin is an empty one
        if not count:
            self._queue(encode_stdin_eof())
            self.stdin_fd = None
            self._flush()
            return
        self._queue(frame_header(Channel.STDIN, count), bytes(self._input_buffer()[:count]))
        self._flush()

    def _splice_stdin(self) -> None:
        """A stdin frame whose payload goes pipe -> socket inside the kernel.

        FIONREAD says how much the pipe holds, so the header can go first;
        whatever the splice does not move is read and queued (same frame).
        """
        assert self.stdin_fd is not None
        try:
            count = min(available(self.stdin_fd), _READ_SIZE)
        except OSError:
            count = 0
        if not count:  # EOF (or a spurious wake-up): the plain path tells which
            self.splice_from = False
            self._read_stdin()
            self.splice_from = self.stdin_fd is not None
            return
        header = frame_header(Channel.STDIN, count)
        try:
            sent = self.sock.send(header)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._flush_failed()
            return
        if sent < len(header):
            self._queue(header[sent:], read_exact(self.stdin_fd, count))
            return
        try:
            moved = os.splice(self.stdin_fd, self.sock.fileno(), count,
                              flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)  # fmt: skip
        except BlockingIOError:
            moved = 0
        except (BrokenPipeError, ConnectionResetError):
            self._flush_failed()
            return
        except OSError:
            self.splice_from = False
            moved = 0
        if moved < count:
            self._queue(read_exact(self.stdin_fd, count - moved))

    def _flush_failed(self) -> None:
        """The server went away; its exit or error frame may still be readable,
        so stop sending and let the read side decide."""
        self.outgoing.clear()
        self.outgoing_size = 0
        self.stdin_fd = None

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
                self._flush_failed()
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


def _spliceable(fd: int) -> bool:
    """Whether splice suits ``fd``: a pipe (splice needs one end to be a pipe,
    the other end being our socket) that blocks (a full non-blocking one
    would make us spin)."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and os.get_blocking(fd)
    except OSError:
        return False


def _file_like(fd: int) -> bool:
    """A regular file or a character device (/dev/null) that blocks: splice-able from a pipe."""
    try:
        mode = os.fstat(fd).st_mode
        return (stat.S_ISREG(mode) or stat.S_ISCHR(mode)) and os.get_blocking(fd)
    except OSError:
        return False


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


def _lost(exc: OSError) -> BrokerUnavailable:
    """The error for a broker connection that failed mid-call."""
    return BrokerUnavailable(f"lost the broker connection: {exc.strerror}")


def _closed() -> BrokerUnavailable:
    """The error for a broker that hung up before the exit frame."""
    return BrokerUnavailable("the broker closed the connection without an exit status")


def _write_all(fd: int, data: bytes | memoryview) -> None:
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
