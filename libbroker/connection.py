"""One broker connection: a request, a sandboxed child, frames both ways.

The connection owns its child from spawn to reap: the child is waited for
through a pidfd, killed (whole process group) when the client goes away or
the server stops, and released (private tmp removed) once reaped.

Bulk data never passes through Python: an output frame is its 5-byte header
followed by ``splice(pipe -> socket)`` of exactly the bytes the pipe holds
(FIONREAD), and a stdin frame's payload goes ``splice(socket -> pipe)`` once
its header is read.  Python only parses headers and small frames, which is
what keeps a 1 GiB stream near the speed of a plain pipe.  When a splice
moves less than a whole frame, the rest is copied and queued, so frames are
never interleaved.  Backpressure is plain: output pipes are not read while
anything is queued for the client, and the socket is not read while the
command's stdin pipe is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libbroker.errors import ProtocolError, RequestRefused, SpawnError
from libbroker.executor import Child, Executor
from libbroker.ops import checked_cwd, spawn_gpg
from libbroker.pipes import SPLICE_FLAGS, available, read_exact, set_pipe_size
from libbroker.wire import (
    CLIENT_CHANNELS,
    HEADER,
    HEADER_SIZE,
    MAX_PAYLOAD,
    Channel,
    Request,
    check_header,
    decode_signal,
    encode_error,
    encode_exit,
    encode_frame,
    frame_header,
    parse_request,
)

if TYPE_CHECKING:
    from libbroker.audit import AuditLog

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
    connections: set[Connection] = field(default_factory=set)
    splice: bool = True  # cleared if the kernel refuses splice between pipe and socket


def _pipe() -> tuple[int, int]:
    """A pipe of 1 MiB (fewer, bigger frames), both ends close-on-exec."""
    r, w = os.pipe2(os.O_CLOEXEC)
    set_pipe_size(w, MAX_PAYLOAD)
    return r, w


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
        fmt = "3i"
        pid, uid, _ = struct.unpack(
            fmt, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
        )
        self.peer = (pid, uid)
        # reading side: a header, then a payload of ``remaining`` bytes
        self.header = bytearray()
        self.frame: Channel | None = None
        self.remaining = 0
        self.payload = bytearray()
        self.reading = False
        # writing side
        self.outq: list[bytes] = []
        self.writing = False
        self.half_closed = False
        # the command
        self.request: Request | None = None
        self.child: Child | None = None
        self.pidfd: int | None = None
        self.outputs: dict[int, Channel] = {}
        self.outputs_on = False
        self.stdin_fd: int | None = None
        # True while the command's stdin pipe is full: the loop watches the
        # pipe for room instead of the socket for data.
        self.stdin_stalled = False
        self.watchdog: asyncio.TimerHandle | None = None
        self.closed = False
        self.client_gone = False
        self.finished = False
        self.done = self.loop.create_future()
        self.started = time.monotonic()
        self.timers: list[asyncio.TimerHandle] = []
        self.overtime = ""  # set when the wall-clock limit ended the command

    def start(self) -> None:
        self.s.connections.add(self)
        if self.peer[1] != os.getuid():
            self.refuse(f"peer uid {self.peer[1]} is not the server's uid {os.getuid()}")
            return
        self._read_socket(True)
        self.timers.append(self.loop.call_later(REQUEST_TIMEOUT, self._request_timeout))

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
            self.refuse(f"protocol error: {exc}")
        except ConnectionError:
            self._client_gone()
        except Exception as exc:  # anything else: end this connection, not the server
            self._internal_error(exc)

    def _read_step(self) -> bool:
        """Make progress on the incoming stream; False when nothing more can be done now."""
        if self.frame is None:
            try:
                data = self.sock.recv(HEADER_SIZE - len(self.header))
            except BlockingIOError:
                return self._socket_empty()
            if not data:
                self._client_gone()
                return False
            self.header += data
            if len(self.header) < HEADER_SIZE:
                return True
            raw_channel, length = HEADER.unpack(self.header)
            self.header.clear()
            self.frame = self._check_frame(check_header(raw_channel, length, CLIENT_CHANNELS))
            self.remaining = length
            if length == 0:
                self._frame_done(b"")
            return True
        if self.frame is Channel.STDIN:
            return self._stdin_step()
        try:
            data = self.sock.recv(self.remaining)
        except BlockingIOError:
            return self._socket_empty()
        if not data:
            self._client_gone()
            return False
        self.payload += data
        self.remaining -= len(data)
        if not self.remaining:
            payload = bytes(self.payload)
            self.payload.clear()
            self._frame_done(payload)
        return True

    def _check_frame(self, channel: Channel) -> Channel:
        if self.request is None and channel is not Channel.REQUEST:
            raise ProtocolError("the first frame must be a request")
        if self.request is not None and channel is Channel.REQUEST:
            raise ProtocolError("only one request per connection")
        return channel

    def _frame_done(self, payload: bytes) -> None:
        frame, self.frame = self.frame, None
        if self.finished:
            return
        if frame is Channel.REQUEST:
            self._on_request(payload)
        elif frame is Channel.STDIN:  # only the empty one, EOF, comes here
            self._close_stdin()
        elif frame is Channel.SIGNAL:
            signum = decode_signal(payload)
            if self.child is not None and self.pidfd is not None:
                self.child.send_signal(signum)

    def _stdin_step(self) -> bool:
        """Splice a stdin payload from the socket into the command's stdin pipe."""
        if self.stdin_fd is None or self.finished:
            # No stdin asked for, or the command closed it: discard.
            try:
                data = self.sock.recv(min(self.remaining, MAX_PAYLOAD))
            except BlockingIOError:
                return self._socket_empty()
            if not data:
                self._client_gone()
                return False
            moved = len(data)
        elif not self.s.splice:
            return self._stdin_copy_step()
        else:
            try:
                moved = os.splice(self.fd, self.stdin_fd, self.remaining, flags=SPLICE_FLAGS)
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
        self.remaining -= moved
        if not self.remaining:
            self.frame = None
        return True

    def _stdin_copy_step(self) -> bool:
        """Without splice: recv and write (blocking the stream while the pipe is full)."""
        assert self.stdin_fd is not None
        if self._stdin_full():
            return self._stall_stdin()
        try:
            data = self.sock.recv(min(self.remaining, 1 << 16))
        except BlockingIOError:
            return self._socket_empty()
        if not data:
            self._client_gone()
            return False
        try:
            os.write(self.stdin_fd, data)  # poll said writable: at least 4 KiB fit (PIPE_BUF)
        except OSError:
            self._close_stdin()
        self.remaining -= len(data)
        if not self.remaining:
            self.frame = None
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

    # --- requests -----------------------------------------------------------

    def _on_request(self, payload: bytes) -> None:
        try:
            self.request = request = parse_request(payload)
            if self.s.audit.broken is not None and request.op != "ping":
                raise RequestRefused(
                    f"the audit log cannot be written ({self.s.audit.broken}): "
                    "refusing to run unaudited"
                )
            if request.op == "ping":
                self._queue(encode_exit(0))
                self._finish(exit_status=0)
            elif request.op == "sign":
                self._start(request, self._spawn_gpg)
            else:
                self._start(request, self._spawn_sandboxed)
        except (RequestRefused, SpawnError) as exc:
            self.refuse(str(exc))

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

    def _on_output(self, fd: int, channel: Channel) -> None:
        try:
            self._output_frame(fd, channel)
        except Exception as exc:  # end this connection, not the server
            self._internal_error(exc)

    def _output_frame(self, fd: int, channel: Channel) -> None:
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

    def _copy_output(self, fd: int, channel: Channel) -> bool:
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
        if self.client_gone or self.closed:
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
        if self.finished:
            self._half_close()
        else:
            self._read_outputs(True)

    def _half_close(self) -> None:
        """All said: shut our side and wait (briefly) for the client to hang up.

        Closing while the client still sends (stdin) would reset the
        connection, and the client could lose the last frame.
        """
        if self.half_closed or self.closed:
            return
        self.half_closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self.frame = Channel.STDIN
        self.remaining = 1 << 62  # from now on everything read is discarded
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
        # The command is over: so is anything it left running in its group.
        self.child.kill()
        if self.finished:  # refused, or the client went away: nothing more to say
            self.child.release()
            self._maybe_done()
            return
        code = os.waitstatus_to_exitcode(status)
        exit_status = 128 - code if code < 0 else code
        self._read_outputs(False)
        for fd, channel in list(self.outputs.items()):
            while fd in self.outputs and self._copy_output(fd, channel):
                pass
        self._close_stdin()
        # A limit hit is an ordinary event the caller should hear of, on stderr.
        for hit in [*self.child.limits_hit(), *([self.overtime] if self.overtime else [])]:
            line = f"broker: the command hit its {hit}\n"
            self._queue(encode_frame(Channel.STDERR, line.encode()))
        self._queue(encode_exit(exit_status))
        self._finish(exit_status=exit_status)

    # --- endings ------------------------------------------------------------

    def _internal_error(self, exc: Exception) -> None:
        """A bug met on this connection: one line on stderr, an error frame, the command ended."""
        sys.stderr.write(
            f"broker-server: internal error on a connection: {type(exc).__name__}: {exc}\n"
        )
        if self.finished:
            self._close_socket()
        else:
            self.refuse(f"internal error: {type(exc).__name__}")

    def refuse(self, message: str) -> None:
        """Answer with an error frame, close, and log the refusal."""
        self._queue(encode_error(message))
        self._finish(refused=message)

    def _request_timeout(self) -> None:
        if self.request is None and not self.finished:
            self.refuse(f"no request within {REQUEST_TIMEOUT:.0f} s")

    def stop(self) -> None:
        """Server shutdown: end the command (its exit frame still goes out)."""
        if self.child is not None and self.pidfd is not None:
            self.child.kill()
        elif not self.finished:
            self.refuse("the broker is shutting down")
        else:
            self._close_socket()  # all said already: no need to wait for the hang-up

    def _client_gone(self) -> None:
        self.client_gone = True
        self._close_socket()
        if not self.finished:
            self._finish()

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

    def _finish(self, *, exit_status: int | None = None, refused: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self._read_outputs(False)
        for fd in list(self.outputs):
            self._close_output(fd)
        self._close_stdin()
        if self.child is not None:
            if self.pidfd is None:
                self.child.release()
            else:
                self.child.kill()  # still running: reaped and released through the pidfd
        if not self.outq:
            self._half_close()
        request = self.request
        fields: dict[str, object] = {
            "peer_pid": self.peer[0],
            "peer_uid": self.peer[1],
            "op": request.op if request else None,
            "argv": list(request.argv) if request else None,
            "cwd": request.cwd if request else None,
            "duration": round(time.monotonic() - self.started, 6),
        }
        if request is not None and request.key is not None:
            fields["key"] = request.key
        if refused is not None:
            fields["refused"] = refused
        else:
            fields["exit"] = exit_status
            if self.client_gone:
                fields["client_gone"] = True
        self.s.audit.record(**fields)
        self._maybe_done()

    def _maybe_done(self) -> None:
        """``done`` resolves once all is said, the socket closed and the child reaped."""
        if self.finished and self.closed and self.pidfd is None and not self.done.done():
            for timer in self.timers:
                timer.cancel()
            if self.watchdog is not None:
                self.watchdog.cancel()
            self.s.connections.discard(self)
            self.done.set_result(None)
