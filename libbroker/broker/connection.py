"""One broker connection's I/O: a pump around :class:`libbroker.broker.exchange.Exchange`.

The conversation's rules (what may come when, what is refused, what ends
it) live in the exchange; this class reports what happens on the socket,
the pipes and the child as events, and carries out the commands it gets
back.  Frames are decoded by :class:`libbroker.wire.Reader` alone.

The connection owns its child from spawn to reap: the child is waited for
through a pidfd, killed (whole process group) when the exchange says so,
and released (private tmp removed) once reaped.

Bulk data never passes through Python: an output frame is its 5-byte header
followed by ``splice(pipe -> socket)`` of exactly the bytes the pipe holds
(FIONREAD), and a stdin frame's payload goes ``splice(socket -> pipe)`` once
the reader has announced it.  Python only parses headers and small frames,
which is what keeps a 1 GiB stream near the speed of a plain pipe.  When a
splice moves less than a whole frame, the rest is copied and queued, so
frames are never interleaved.  Backpressure is plain: output pipes are not
read while anything is queued for the client, and the socket is not read
while the command's stdin pipe is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

from libbroker.broker.exchange import (
    AuditBroken,
    AuditLine,
    BadFrame,
    ChildExited,
    ClientGone,
    Close,
    CloseStdin,
    Command,
    DeliverSignal,
    Event,
    Exchange,
    HalfClose,
    InternalError,
    KillGroup,
    Opened,
    Refuse,
    RequestTimeout,
    SendExit,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    State,
    from_wire,
)
from libbroker.broker.executor import Child, Executor
from libbroker.broker.ops import checked_cwd, spawn_gpg
from libbroker.broker.pipes import SPLICE_FLAGS, available, read_exact, set_pipe_size
from libbroker.errors import ProtocolError, RequestRefused, SpawnError
from libbroker.wire import (
    CLIENT_CHANNELS,
    HEADER_SIZE,
    MAX_PAYLOAD,
    Channel,
    Reader,
    Request,
    encode_error,
    encode_exit,
    encode_frame,
    frame_header,
)

if TYPE_CHECKING:
    from libbroker.broker.audit import AuditLog

REQUEST_TIMEOUT = 30.0
LINGER = 5.0  # how long a finished connection waits for the client to hang up
SOCKET_BUFFER = 4 * MAX_PAYLOAD


@dataclass
class Settings:
    """What every connection needs from the server."""

    workdir: str
    executor: Executor
    audit: AuditLog
    sign_keys: frozenset[str] = frozenset()
    gpg: str | None = None
    splice: bool = True  # cleared if the kernel refuses splice between pipe and socket


def _pipe() -> tuple[int, int]:
    """A pipe of 1 MiB (fewer, bigger frames), both ends close-on-exec."""
    r, w = os.pipe2(os.O_CLOEXEC)
    set_pipe_size(w, MAX_PAYLOAD)
    return r, w


_STDIN = frozenset({Channel.STDIN})  # the one payload the pump moves itself (splice)


class Connection:
    """The server side of one connection, on the running event loop."""

    def __init__(self, sock: socket.socket, settings: Settings) -> None:
        self.s = settings
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.fd = sock.fileno()
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            # Whole frames per send/splice, fewer wake-ups (capped by wmem_max).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        self.exchange = Exchange()
        self.reader = Reader(CLIENT_CHANNELS, passthrough=_STDIN)
        self.reading = False
        # writing side
        self.outq: list[bytes] = []
        self.writing = False
        self.ending = False  # HalfClose came: nothing more from the command, nor the client
        self.half_closed = False
        # the command
        self.child: Child | None = None
        self.pidfd: int | None = None
        self.outputs: dict[int, int] = {}
        self.outputs_on = False
        self.stdin_fd: int | None = None
        # True while the command's stdin pipe is full: the loop watches the
        # pipe for room instead of the socket for data.
        self.stdin_stalled = False
        self.watchdog: asyncio.TimerHandle | None = None
        self.closed = False
        self.done = self.loop.create_future()
        self.timers: list[asyncio.TimerHandle] = []
        self.overtime = ""  # set when the wall-clock limit ended the command

    def start(self) -> None:
        fmt = "3i"
        pid, uid, _ = struct.unpack(
            fmt, self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
        )
        self._event(Opened(pid, uid, os.getuid()))
        self._read_socket(True)
        timeout = RequestTimeout(REQUEST_TIMEOUT)
        self.timers.append(self.loop.call_later(REQUEST_TIMEOUT, self._event, timeout))

    def _event(self, event: Event) -> None:
        """Report ``event`` to the exchange and carry out what it commands, in order."""
        for command in self.exchange.handle(event):
            self._carry_out(command)
        self._maybe_done()

    def _carry_out(self, command: Command) -> None:
        match command:
            case Spawn():
                self._spawn(command)
            case Refuse():
                self._refuse(command)
            case DeliverSignal():
                self._deliver_signal(command)
            case CloseStdin():
                self._close_stdin()
            case SendExit():
                self._send_exit(command)
            case KillGroup():
                self._kill_group(command)
            case AuditLine():
                self._audit_line(command)
            case HalfClose():
                self._end_output(command)
            case Close():
                self._close_socket()
            case _:
                assert_never(command)

    # --- reading the socket -------------------------------------------------

    def _read_socket(self, on: bool) -> None:
        if on and not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _on_readable(self) -> None:
        try:
            for _ in range(64):  # then let the other connections have a turn
                if self.closed or not (self.reading or self.stdin_stalled):
                    return
                if not self._read_step():
                    return
        except ProtocolError as exc:
            self._event(BadFrame(str(exc)))
        except ConnectionError:
            self._client_gone()
        except Exception as exc:  # anything else: end this connection, not the server
            self._internal_error(exc)

    def _read_step(self) -> bool:
        """Make progress on the incoming stream; False when nothing more can be done now."""
        if self.ending:
            return self._discard_step()
        if self.reader.passing:
            return self._stdin_step()
        event = self.reader.next_event()
        if event is not None:
            if self.s.audit.broken is not None:  # the log is shared: report its state first
                self._event(AuditBroken(self.s.audit.broken))
            self._event(from_wire(event))
            return True
        data = self._recv(self.reader.want())
        if data is None:
            return False
        self.reader.feed(data)
        return True

    def _recv(self, count: int) -> bytes | None:
        """Up to ``count`` bytes from the client; None when there are none now or it hung up."""
        try:
            data = self.sock.recv(count)
        except BlockingIOError:
            self._socket_empty()
            return None
        if not data:
            self._client_gone()
            return None
        return data

    def _discard_step(self) -> bool:
        """All said: what the client still sends is read and dropped until it hangs up.

        Closing while the client still sends (stdin) would reset the
        connection, and the client could lose the last frame.
        """
        return self._recv(MAX_PAYLOAD) is not None

    def _stdin_step(self) -> bool:
        """Splice a stdin payload from the socket into the command's stdin pipe."""
        remaining = self.reader.passing
        if self.stdin_fd is None:
            # No stdin asked for, or the command closed it: discard.
            data = self._recv(min(remaining, MAX_PAYLOAD))
            if data is None:
                return False
            moved = len(data)
        elif not self.s.splice:
            return self._stdin_copy_step(remaining)
        else:
            try:
                moved = os.splice(self.fd, self.stdin_fd, remaining, flags=SPLICE_FLAGS)
            except BlockingIOError:
                if self._stdin_full():
                    return self._stall_stdin()
                return self._socket_empty()
            except (BrokenPipeError, ConnectionResetError) as exc:
                if isinstance(exc, ConnectionResetError):
                    raise
                self._close_stdin()  # the command closed its stdin: drop the rest
                return True
            if not moved:
                self._client_gone()
                return False
        self.reader.passed(moved)
        return True

    def _stdin_copy_step(self, remaining: int) -> bool:
        """Without splice: recv and write (blocking the stream while the pipe is full)."""
        assert self.stdin_fd is not None
        if self._stdin_full():
            return self._stall_stdin()
        data = self._recv(min(remaining, 1 << 16))
        if data is None:
            return False
        try:
            os.write(self.stdin_fd, data)  # poll said writable: at least 4 KiB fit (PIPE_BUF)
        except OSError:
            self._close_stdin()
        self.reader.passed(len(data))
        return True
    def _stdin_full(self) -> bool:
        assert self.stdin_fd is not None
        poller = select.poll()
        poller.register(self.stdin_fd, select.POLLOUT)
        return not poller.poll(0)

    def _stall_stdin(self) -> bool:
        """The command's stdin pipe is full: wait for room in it, not for the socket.

        The pipe stays watched until the socket runs dry (:meth:`_socket_empty`):
        a command that reads slowly wakes us once per read, and each wake-up
        goes straight to the next splice, with no re-registering in between.
        """
        if not self.stdin_stalled:
            assert self.stdin_fd is not None
            self._read_socket(False)
            self.loop.add_writer(self.stdin_fd, self._on_readable)
            self.stdin_stalled = True
            self._arm_watchdog()  # meanwhile a hang-up goes unseen: poll for it now and then
        return False

    def _socket_empty(self) -> bool:
        """Nothing to read: from now on wait for the socket (the pipe has room)."""
        self._unstall_stdin()
        return False

    def _unstall_stdin(self) -> None:
        if self.stdin_stalled:
            self.stdin_stalled = False
            if self.stdin_fd is not None:
                self.loop.remove_writer(self.stdin_fd)
            self._read_socket(not self.closed)

    def _arm_watchdog(self) -> None:
        """While the socket is not read a hang-up goes unseen; poll for it now and then."""
        if self.watchdog is None:
            self.watchdog = self.loop.call_later(0.5, self._check_hangup)

    def _check_hangup(self) -> None:
        self.watchdog = None
        if self.reading or self.closed:
            return
        poller = select.poll()
        poller.register(self.fd, select.POLLRDHUP)
        gone = select.POLLHUP | select.POLLRDHUP | select.POLLERR
        if any(ev & gone for _, ev in poller.poll(0)):
            self._client_gone()
        else:
            self._arm_watchdog()

    # --- the exchange's commands ----------------------------------------------

    def _spawn(self, command: Spawn) -> None:
        request = command.request
        spawn = self._spawn_gpg if request.op == "sign" else self._spawn_sandboxed
        try:
            self._start(request, spawn)
        except (RequestRefused, SpawnError) as exc:
            self._event(SpawnFailed(str(exc)))
        else:
            self._event(Spawned())

    def _refuse(self, command: Refuse) -> None:
        self._queue(encode_error(command.message))

    def _deliver_signal(self, command: DeliverSignal) -> None:
        assert self.child is not None
        self.child.send_signal(command.signum)

    def _kill_group(self, command: KillGroup) -> None:
        assert self.child is not None
        self.child.kill()

    def _audit_line(self, command: AuditLine) -> None:
        self.s.audit.record(**command.fields)

    def _send_exit(self, command: SendExit) -> None:
        """The exit frame is the last: what the pipes still hold goes out first."""
        self._read_outputs(False)
        for fd, channel in list(self.outputs.items()):
            while fd in self.outputs and self._copy_output(fd, channel):
                pass
        for line in command.stderr:
            self._queue(encode_frame(Channel.STDERR, line.encode()))
        self._queue(encode_exit(command.status))

    def _end_output(self, command: HalfClose) -> None:
        """Nothing more from the command; the half-close follows the queue out."""
        self.ending = True
        self._read_outputs(False)
        for fd in list(self.outputs):
            self._close_output(fd)
        if not self.outq:
            self._half_close()

    def _spawn_sandboxed(self, request: Request, stdio: tuple[int, int, int]) -> Child:
        cwd = checked_cwd(request.cwd, self.s.workdir)
        child = self.s.executor.spawn(request.argv, cwd, stdio)
        timeout = self.s.executor.timeout
        if timeout is not None:
            self.timers.append(self.loop.call_later(timeout, self._timed_out, timeout))
        return child

    def _timed_out(self, timeout: float) -> None:
        """The profile's wall clock ran out: end the command (its exit frame says 137)."""
        if self.child is not None and self.pidfd is not None:
            self.overtime = f"time limit ({timeout:g}s): it was killed"
            self.child.kill()

    def _spawn_gpg(self, request: Request, stdio: tuple[int, int, int]) -> Child:
        return spawn_gpg(self.s.gpg, self.s.sign_keys, request.key, stdio)

    def _start(
        self, request: Request, spawn: Callable[[Request, tuple[int, int, int]], Child]
    ) -> None:
        stdin_r, stdin_w = _pipe() if request.with_stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        try:
            self.child = spawn(request, (stdin_r, out_w, err_w))
        except BaseException:
            for fd in (stdin_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w, err_w):
                os.close(fd)
        self.pidfd = os.pidfd_open(self.child.pid)
        self.loop.add_reader(self.pidfd, self._on_pidfd)
        for fd, channel in ((out_r, Channel.STDOUT), (err_r, Channel.STDERR)):
            os.set_blocking(fd, False)
            self.outputs[fd] = channel
        self._read_outputs(True)
        if stdin_w >= 0:
            os.set_blocking(stdin_w, False)
            self.stdin_fd = stdin_w

    def _close_stdin(self) -> None:
        if self.stdin_fd is not None:
            self.loop.remove_writer(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None
            self.stdin_stalled = False
            self._read_socket(not self.closed)

    # --- output -------------------------------------------------------------

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

    # --- writing the socket -------------------------------------------------

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

    # --- the child ends -----------------------------------------------------

    def _on_pidfd(self) -> None:
        try:
            self._on_child_exit()
        except Exception as exc:  # end this connection, not the server
            self._internal_error(exc)

    def _on_child_exit(self) -> None:
        assert self.child is not None and self.pidfd is not None
        try:
            pid, status = os.waitpid(self.child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.child.pid, 255 << 8
        if pid == 0:
            return
        self.loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = None
        hits = (*self.child.limits_hit(), *([self.overtime] if self.overtime else []))
        self._event(ChildExited(os.waitstatus_to_exitcode(status), hits))
        self.child.release()

    # --- endings ------------------------------------------------------------

    def _internal_error(self, exc: Exception) -> None:
        """A bug met on this connection: one line on stderr, then the exchange decides."""
        sys.stderr.write(
            f"broker-server: internal error on a connection: {type(exc).__name__}: {exc}\n"
        )
        self._event(InternalError(type(exc).__name__))

    def stop(self) -> None:
        """Server shutdown: the exchange ends the command (its exit frame still goes out)."""
        self._event(Shutdown())

    def _client_gone(self) -> None:
        self._close_socket()
        self._event(ClientGone())

    def _close_socket(self) -> None:
        if self.closed:
            return
        self._read_socket(False)
        if self.writing:
            self.loop.remove_writer(self.fd)
            self.writing = False
        self.closed = True
        self.outq.clear()
        self.sock.close()
        self._maybe_done()

    def _maybe_done(self) -> None:
        """``done`` resolves once all is said, the socket closed and the child reaped."""
        if self.exchange.state is State.DONE and self.closed and not self.done.done():
            for timer in self.timers:
                timer.cancel()
            if self.watchdog is not None:
                self.watchdog.cancel()
            self.done.set_result(None)
