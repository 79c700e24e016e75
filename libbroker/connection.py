"""One broker connection: a request, a sandboxed child, frames both ways.

An asyncio Protocol driven by the sans-I/O :class:`~libbroker.wire.FrameDecoder`.
The connection owns its child from spawn to reap: the child is waited for
through a pidfd, killed (whole process group) when the client goes away or
the server stops, and released (private tmp removed) once reaped.

Output is read from the pipes as it comes and sent at once, one frame per
read; when the client reads slowly the pipe readers pause (the command then
blocks on its own writes), so memory stays bounded in both directions.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libbroker.errors import ProtocolError, RequestRefused, SpawnError
from libbroker.executor import Child, Executor, killpg_quietly
from libbroker.wire import (
    CLIENT_CHANNELS,
    MAX_PAYLOAD,
    Channel,
    FrameBuffer,
    Request,
    decode_signal,
    encode_error,
    encode_exit,
    frame_header,
    lazy_buffer,
    parse_request,
)

if TYPE_CHECKING:
    from libbroker.audit import AuditLog

REQUEST_TIMEOUT = 30.0
LINGER = 5.0  # how long a finished connection waits for the client to hang up
STDIN_BACKLOG = 4 * MAX_PAYLOAD  # stop reading the socket beyond this much unwritten stdin
_F_SETPIPE_SZ = 1031
_PIPE_SIZE = MAX_PAYLOAD
SOCKET_BUFFER = 4 * MAX_PAYLOAD  # big pipes: fewer, larger reads and frames


@dataclass
class Settings:
    """What every connection needs from the server."""

    workdir: str
    executor: Executor
    audit: AuditLog
    sign_keys: frozenset[str] = frozenset()
    gpg: str | None = None
    connections: set[Connection] = field(default_factory=set)


class PlainChild(Child):
    """A host process outside any sandbox (the gpg of the sign op)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def send_signal(self, signum: int) -> None:
        killpg_quietly(self.pid, signum)

    def kill(self) -> None:
        killpg_quietly(self.pid, 9)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_SIZE)
    return r, w


class Connection(asyncio.BufferedProtocol):
    """The server side of one connection."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.frames = FrameBuffer(accept=CLIENT_CHANNELS)
        self.peer = (0, -1)  # pid, uid
        self.request: Request | None = None
        self.child: Child | None = None
        self.pidfd: int | None = None
        self.outputs: dict[int, Channel] = {}
        self.stdin_fd: int | None = None
        self.outbuf = lazy_buffer(MAX_PAYLOAD)
        self.stdin_buf: list[bytes] = []
        self.stdin_size = 0
        self.stdin_eof = False
        self.reading_paused = False
        self.writing_paused = False
        self.client_gone = False
        self.finished = False
        self.done = self.loop.create_future()
        self.started = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.watchdog: asyncio.TimerHandle | None = None

    # --- asyncio callbacks --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.s.connections.add(self)
        transport.set_write_buffer_limits(high=2 * MAX_PAYLOAD, low=MAX_PAYLOAD // 2)
        sock = transport.get_extra_info("socket")
        # A deep socket buffer lets a whole 1 MiB frame go in one send, so the
        # two ends do not wake each other every 200 KiB (capped by wmem_max).
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        fmt = "3i"
        pid, uid, _gid = struct.unpack(
            fmt, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
        )
        self.peer = (pid, uid)
        if uid != os.getuid():
            self.refuse(f"peer uid {uid} is not the server's uid {os.getuid()}")
            return
        self.timer = self.loop.call_later(REQUEST_TIMEOUT, self._request_timeout)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.space()

    def buffer_updated(self, nbytes: int) -> None:
        if self.finished:
            return
        self.frames.filled(nbytes)
        try:
            for channel, payload in self.frames.frames():
                if self.finished:
                    return
                if self.request is None:
                    if channel is not Channel.REQUEST:
                        self.refuse("protocol error: the first frame must be a request")
                        return
                    self._on_request(bytes(payload))
                elif channel is Channel.STDIN:
                    self._on_stdin(payload)
                elif channel is Channel.SIGNAL:
                    signum = decode_signal(bytes(payload))
                    if self.child is not None and self.pidfd is not None:
                        self.child.send_signal(signum)
                else:
                    self.refuse("protocol error: only one request per connection")
                    return
        except ProtocolError as exc:
            self.refuse(f"protocol error: {exc}")

    def eof_received(self) -> bool:
        return False  # close our side too: a client that stops sending is gone

    def connection_lost(self, exc: Exception | None) -> None:
        self.client_gone = True
        if self.pidfd is not None and self.child is not None:
            self.child.kill()  # reaped through the pidfd, then _finish
        elif not self.finished:
            self._finish()

    def pause_writing(self) -> None:
        self.writing_paused = True
        for fd in self.outputs:
            self.loop.remove_reader(fd)

    def resume_writing(self) -> None:
        self.writing_paused = False
        for fd, channel in self.outputs.items():
            self.loop.add_reader(fd, self._read_output, fd, channel)

    # --- requests -----------------------------------------------------------

    def _on_request(self, payload: bytes) -> None:
        if self.timer is not None:
            self.timer.cancel()
        try:
            self.request = request = parse_request(payload)
            if request.op == "ping":
                self._send(encode_exit(0))
                self._finish(exit_status=0)
            elif request.op == "sign":
                self._start(request, self._spawn_gpg)
            else:
                self._start(request, self._spawn_sandboxed)
        except (RequestRefused, SpawnError) as exc:
            self.refuse(str(exc))

    def _checked_cwd(self, cwd: str) -> str:
        real = os.path.realpath(cwd)
        root = self.s.workdir
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            raise RequestRefused(f"cwd {cwd} is outside the workdir {root}")
        if not os.path.isdir(real):
            raise RequestRefused(f"cwd {cwd} is not a directory")
        return real

    def _spawn_sandboxed(self, request: Request, stdio: tuple[int, int, int]) -> Child:
        cwd = self._checked_cwd(request.cwd)
        return self.s.executor.spawn(request.argv, cwd, stdio)

    def _spawn_gpg(self, request: Request, stdio: tuple[int, int, int]) -> Child:
        if request.key not in self.s.sign_keys:
            raise RequestRefused(f"signing key {request.key!r} is not enabled on this broker")
        if self.s.gpg is None:
            raise SpawnError("gpg is not installed on the host")
        # Outside any sandbox, as the person: only the key comes from the request.
        try:
            proc = subprocess.Popen(
                [self.s.gpg, "--status-fd=2", "-bsau", str(request.key)],
                stdin=stdio[0], stdout=stdio[1], stderr=stdio[2],
                start_new_session=True, cwd="/",
            )  # fmt: skip
        except OSError as exc:
            raise SpawnError(f"cannot start gpg: {exc.strerror}") from None
        proc.returncode = 0  # reaped through the pidfd
        return PlainChild(proc.pid)

    def _start(
        self, request: Request, spawn: Callable[[Request, tuple[int, int, int]], Child]
    ) -> None:
        stdin_r, stdin_w = _pipe() if request.with_stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        try:
            self.child = spawn(request, (stdin_r, out_w, err_w))
        except BaseException:
            for fd in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w, err_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = os.pidfd_open(self.child.pid)
        self.loop.add_reader(self.pidfd, self._on_child_exit)
        for fd, channel in ((out_r, Channel.STDOUT), (err_r, Channel.STDERR)):
            os.set_blocking(fd, False)
            self.outputs[fd] = channel
            self.loop.add_reader(fd, self._read_output, fd, channel)
        if stdin_w >= 0:
            os.set_blocking(stdin_w, False)
            self.stdin_fd = stdin_w

    # --- stdin --------------------------------------------------------------

    def _on_stdin(self, payload: memoryview) -> None:
        if self.stdin_fd is None:
            return  # no stdin asked for, or the command closed it: discard
        if not payload:
            self.stdin_eof = True
        elif not self.stdin_buf:
            # The usual case: straight from the receive buffer into the pipe;
            # only what the pipe cannot take now is copied.
            try:
                written = os.write(self.stdin_fd, payload)
            except BlockingIOError:
                written = 0
            except OSError:
                self._close_stdin()  # the command closed its stdin: drop the rest
                return
            if written < len(payload):
                self.stdin_buf.append(bytes(payload[written:]))
                self.stdin_size += len(payload) - written
        else:
            self.stdin_buf.append(bytes(payload))
            self.stdin_size += len(payload)
        self._write_stdin()
        if self.stdin_size > STDIN_BACKLOG and not self.reading_paused and self.transport:
            self.transport.pause_reading()
            self.reading_paused = True
            self._arm_watchdog()

    def _write_stdin(self) -> None:
        fd = self.stdin_fd
        if fd is None:
            return
        try:
            while self.stdin_buf:
                head = self.stdin_buf[0]
                written = os.write(fd, head)
                self.stdin_size -= written
                if written < len(head):
                    self.stdin_buf[0] = head[written:]
                    break
                self.stdin_buf.pop(0)
        except BlockingIOError:
            pass
        except OSError:
            self._close_stdin()  # the command closed its stdin: drop the rest
            return
        if self.stdin_buf:
            self.loop.add_writer(fd, self._write_stdin)
            return
        self.loop.remove_writer(fd)
        if self.stdin_eof:
            self._close_stdin()
        elif self.reading_paused and self.transport:
            self.transport.resume_reading()
            self.reading_paused = False

    def _close_stdin(self) -> None:
        if self.stdin_fd is not None:
            self.loop.remove_writer(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None
        self.stdin_buf.clear()
        self.stdin_size = 0
        if self.reading_paused and self.transport:
            self.transport.resume_reading()
            self.reading_paused = False

    def _arm_watchdog(self) -> None:
        """While reading is paused a hang-up goes unseen; poll for it now and then."""
        self.watchdog = self.loop.call_later(0.5, self._check_hangup)

    def _check_hangup(self) -> None:
        self.watchdog = None
        if not self.reading_paused or self.transport is None or self.finished:
            return
        sock = self.transport.get_extra_info("socket")
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        if any(ev & (select.POLLHUP | select.POLLRDHUP) for _, ev in poller.poll(0)):
            self.transport.abort()  # connection_lost kills the child
        else:
            self._arm_watchdog()

    # --- output and exit ----------------------------------------------------

    def _read_output(self, fd: int, channel: Channel) -> bool:
        """Move one read's worth from a pipe to the client; False at EOF or nothing to read."""
        try:
            count = os.readv(fd, [self.outbuf])
        except BlockingIOError:
            return False
        except OSError:
            count = 0
        if not count:
            self._close_output(fd)
            return False
        self._send(frame_header(channel, count), memoryview(self.outbuf)[:count])
        if self.transport is not None and self.transport.get_write_buffer_size():
            # The transport may keep a reference to what it could not send
            # yet (Python >= 3.12 does): the next read needs a buffer of its own.
            self.outbuf = lazy_buffer(MAX_PAYLOAD)
        return True

    def _close_output(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        del self.outputs[fd]
        os.close(fd)

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
        if self.finished:  # refused or stopped mid-run: nothing more to say
            self.child.kill()
            self.child.release()
            self._maybe_done()
            return
        code = os.waitstatus_to_exitcode(status)
        exit_status = 128 - code if code < 0 else code
        # The command is over: so is anything it left running in its group.
        self.child.kill()
        for fd, channel in list(self.outputs.items()):
            self._drain(fd, channel)
        self._close_stdin()
        self._send(encode_exit(exit_status))
        self._finish(exit_status=exit_status)

    def _drain(self, fd: int, channel: Channel) -> None:
        while fd in self.outputs and self._read_output(fd, channel):
            pass
        if fd in self.outputs:
            self._close_output(fd)

    def _send(self, *parts: bytes | memoryview) -> None:
        if self.client_gone or self.transport is None or self.transport.is_closing():
            return
        for part in parts:
            self.transport.write(part)

    # --- endings ------------------------------------------------------------

    def refuse(self, message: str) -> None:
        """Answer with an error frame, close, and log the refusal."""
        self._send(encode_error(message))
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

    def _finish(self, *, exit_status: int | None = None, refused: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        for handle in (self.timer, self.watchdog):
            if handle is not None:
                handle.cancel()
        for fd in list(self.outputs):
            self._close_output(fd)
        self._close_stdin()
        if self.child is not None:
            if self.pidfd is None:
                self.child.release()
            else:
                self.child.kill()  # still running: reaped and released through the pidfd
        if self.transport is not None and not self.transport.is_closing():
            # Half-close and let the client hang up first: closing with its
            # unread bytes (stdin it is still sending) would reset the
            # connection, and the client could lose our last frame.
            if self.transport.can_write_eof() and not self.client_gone:
                self.transport.write_eof()
                self.loop.call_later(LINGER, self.transport.abort)
            else:
                self.transport.close()
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
        """``done`` resolves once the exchange is over and the child is reaped."""
        if self.finished and self.pidfd is None and not self.done.done():
            self.s.connections.discard(self)
            self.done.set_result(None)
