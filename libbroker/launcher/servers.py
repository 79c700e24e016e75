"""The servers' pipes, read as lines: listening lines, events for the record, log lines.

egress-proxy's and broker-server's stdout carry their ``listening`` lines and
their events (:mod:`libbroker.server_lines`); their stderr, log lines, which
are kept until the session runs and then go to the log (:func:`open_log`).
A tenant of the resident gateway reads its proxy's lines from the service's
FIFOs the same way.  The session's one poller is here too: it watches these
pipes and what the session adds to it (the children's pidfds, the wake-up
pipe, the lazy broker's socket, the service's link).
"""

from __future__ import annotations

import contextlib
import os
import select
from typing import TYPE_CHECKING

from libbroker import server_lines
from libbroker.launcher import supervise
from libbroker.launcher.session_service import TenantOutput

if TYPE_CHECKING:
    from libbroker.launcher.config import Config
    from libbroker.launcher.record import SessionRecord
    from libbroker.launcher.serve_link import Link


def open_log(cfg: Config) -> int:
    """Where the servers' log lines go once the session runs.

    A full-screen agent owns an interactive terminal: the proxy's refusals
    would scribble over it, so with stderr on a tty they go to a file under
    the user's state directory (outside the sandbox's reach) unless the
    config names one; otherwise (scripts, CI) to stderr.
    """
    path = cfg.log_file
    if not path:
        if not os.isatty(2):
            return 2
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(cfg.home, ".local", "state")
        path = os.path.join(base, "agent-sandbox", "session.log")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        os.write(
            2, f"agent-sandbox: cannot open log {path} ({exc.strerror}); logging here\n".encode()
        )
        return 2


class ServerPipes:
    """The servers' pipes by fd, their partial lines, and what they said so far."""

    def __init__(self) -> None:
        self.poller = select.poll()
        self.owners: dict[int, tuple[supervise.Child | TenantOutput, str]] = {}
        self.pending: dict[int, bytes] = {}
        self.serving: set[str] = set()  # servers that said `listening`
        self.early: list[str] = []  # their stderr before the session runs
        self.started = False  # servers' stderr is copied to the log once started
        self.log = 2
        self.tenant_out: TenantOutput | None = None  # its gateway's record lines for us

    def watch(self, child: supervise.Child) -> None:
        """A server's stdout and stderr, read as lines from now on (:meth:`read_lines`)."""
        assert child.proc.stdout is not None and child.proc.stderr is not None
        for stream, kind in ((child.proc.stdout, "out"), (child.proc.stderr, "err")):
            os.set_blocking(stream.fileno(), False)
            self.owners[stream.fileno()] = (child, kind)
            self.poller.register(stream.fileno(), select.POLLIN)

    def watch_tenant(self, service: Link) -> None:
        """The resident gateway's FIFOs for this session's tenant: its record and log lines."""
        self.tenant_out = TenantOutput(service)
        for fd, kind in ((service.record_fd, "out"), (service.log_fd, "err")):
            if fd >= 0:
                self.owners[fd] = (self.tenant_out, kind)
                self.poller.register(fd, select.POLLIN)

    def start_log(self, cfg: Config) -> None:
        """The session runs: log lines go to the log from now on, the early ones first."""
        self.started = True
        self.log = open_log(cfg)
        if self.early:
            os.write(self.log, "".join(line + "\n" for line in self.early).encode())

    def close_log(self) -> None:
        if self.log != 2:
            os.close(self.log)
            self.log = 2

    def read_lines(self, fd: int, record: SessionRecord | None) -> list[str]:
        """Read what is there on a child's pipe; complete lines, copied to stderr when errors.

        A server's event goes into ``record`` (the session's, once it runs).
        """
        child, kind = self.owners[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return []
        if not data:
            self.unwatch(fd)
            data = b"\n" if self.pending.get(fd) else b""
        buf = self.pending.get(fd, b"") + data
        *lines, rest = buf.split(b"\n")
        self.pending[fd] = rest
        out = [line.decode(errors="replace") for line in lines]
        for line in out:
            if kind == "out" and server_lines.listening_url(line) is not None:
                self.serving.add(child.name)  # it accepts now (the socket listened already)
                continue  # not a line for an error's tail
            if kind == "out" and record is not None and server_lines.is_event(line):
                # A server's event (libbroker.launcher.record): into the record, not the tail.
                if record.server(child.name, line) is False and child.name == "broker-server":
                    self.stop_audit(fd)  # the broker fails closed: its audit pipe is gone
                    break
                continue
            child.tail.append(line)
            if kind == "err" and line and not self.started:
                self.early.append(line)  # shown once started, or in the error
            elif kind == "err" and line:
                # A server's log line goes to our stderr, never to our stdout
                # (which belongs to CMD, e.g. in a pipeline).
                with contextlib.suppress(OSError):
                    os.write(self.log, (line + "\n").encode())
        return out

    def unwatch(self, fd: int) -> None:
        """Stop polling ``fd`` (at its end of file); a second call is a no-op.

        One poll batch can name a pipe twice over: the service's link ends, the
        drain that follows reads every pipe to its end, and then the same batch
        hands over the pipe's own hang-up.  Its second end of file is no error.
        """
        with contextlib.suppress(KeyError):
            self.poller.unregister(fd)

    def stop_audit(self, fd: int) -> None:
        """Close our end of the broker's stdout: its next audit line fails, so it refuses."""
        child, _ = self.owners.pop(fd)
        assert isinstance(child, supervise.Child)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(fd)
        assert child.proc.stdout is not None
        child.proc.stdout.close()

    def drain_all(self, record: SessionRecord | None) -> None:
        """Every pipe's lines that are there now."""
        for fd in list(self.owners):
            with contextlib.suppress(OSError, KeyError):
                self.read_lines(fd, record)
