"""One broker connection's I/O: a pump around :class:`libbroker.broker.exchange.Exchange`.

The conversation's rules (what may come when, what is refused, what ends
it) live in the exchange; this class reports what happens on the socket,
the pipes and the child as events, and carries out the commands it gets
back.  Frames are decoded by :class:`libbroker.wire.Reader` alone.

The connection owns its child from spawn to reap: the child is waited for
through a pidfd, killed (whole process group) when the exchange says so,
and released (private tmp removed) once reaped.

Its two directions are its bases, each in a module of its own:
:class:`.connection_in.FromClient` reads the socket and splices a stdin
payload into the command's pipe; :class:`.connection_out.ToClient` sends the
command's output as frames (header, then ``splice(pipe -> socket)``), queues
what could not go at once and half-closes at the end.  Bulk data never passes
through Python; backpressure is plain: output pipes are not read while
anything is queued for the client, and the socket is not read while the
command's stdin pipe is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

from libbroker.broker.connection_in import FromClient
from libbroker.broker.connection_out import ToClient
from libbroker.broker.exchange import (
    AuditLine,
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
)
from libbroker.broker.executor import Child, Executor
from libbroker.broker.ops import checked_cwd, spawn_gpg
from libbroker.broker.pipes import set_pipe_size
from libbroker.errors import RequestRefused, SpawnError
from libbroker.wire import (
    CLIENT_CHANNELS,
    MAX_PAYLOAD,
    Channel,
    Reader,
    Request,
    encode_error,
    encode_exit,
    encode_frame,
)

if TYPE_CHECKING:
    from libbroker.broker.audit import AuditLog

REQUEST_TIMEOUT = 30.0
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


class Connection(FromClient, ToClient):  # FromClient first: its _read_socket is the one
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
