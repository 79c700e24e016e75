"""A session's link to the resident service (``agent-sandbox serve``; docs/serve.md).

Light on purpose (``os``, ``_socket``, ``_json``-free until a request is made):
``agent-sandbox run`` asks whether a service listens before it spawns its own
servers (:mod:`.prestart`), so this costs the launcher a connect() and no
import of ``socket`` (whose enum conversions cost ms).

The link is one unix stream connection, held by the launcher for the whole
session and by no other process (the descriptor is close-on-exec: neither the
sandbox nor a server inherits it).  On it the launcher sends one ``session``
request and reads one reply: the gateway's ports for the tenant the service
added (name and password the launcher chose).  From then on nothing more is
said: the connection itself is the registration.  When the launcher exits,
however it exits, the kernel closes it and the service removes the tenant;
when the service goes, the launcher sees end of file and ends the session
(fail closed: the sandbox loses its proxy, never gains another).
"""

from __future__ import annotations

import _socket
import contextlib
import io
import os
import select

from libbroker.errors import LaunchError
from libbroker.launcher.child import Child, Proc
from libbroker.launcher.here import here

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the start's cost)
if TYPE_CHECKING:
    from typing import Any

SOCKET_ENV = "AGENT_SANDBOX_SERVE"  # the service's socket; "off" (or "") asks for none
SOCKET_NAME = "serve.sock"
MAX_REPLY = 64 * 1024
_UCRED_SIZE = 12  # struct ucred: pid, uid, gid
_CMSG_ONE_FD = _socket.CMSG_SPACE(4)


def default_socket(environ: dict[str, str] | None = None) -> str:
    """Where the service listens for this user: "" when there is no such place."""
    env = os.environ if environ is None else environ
    named = env.get(SOCKET_ENV)
    if named is not None:
        return "" if named in ("", "off") else named
    base = env.get("XDG_RUNTIME_DIR", "")
    if not base or not os.path.isabs(base):
        return ""
    return os.path.join(base, "agent-sandbox", SOCKET_NAME)


def peer_ids(sock: _socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of unix socket ``sock`` (SO_PEERCRED)."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED_SIZE)
    pid = int.from_bytes(raw[0:4], "little", signed=True)
    uid = int.from_bytes(raw[4:8], "little")
    return pid, uid


class ForeignProc(Proc):
    """A process the launcher did not fork (the zygote's child), known by its pidfd.

    Its exit status goes to its parent, not to us: once the pidfd says it has
    exited, ``returncode`` is 1 ("ended", status unknown).
    """

    def __init__(self, pid: int, pidfd: int, stdin: io.FileIO, stdout: io.FileIO,
                 stderr: io.FileIO) -> None:
        super().__init__(pid, stdin, stdout, stderr)
        self.pidfd = pidfd

    def poll(self) -> int | None:
        if self.returncode is None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            if poller.poll(0):
                self.returncode = 1
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            poller.poll()
            self.returncode = 1
        return self.returncode


class ServiceGone(LaunchError):
    """The service closed the link before it answered (the caller may start its own)."""


class Link:
    """The launcher's end of one session's registration."""

    def __init__(self, sock: _socket.socket, path: str) -> None:
        self.sock = sock
        self.path = path
        self.tenant = "s" + os.urandom(8).hex()
        # 256 random bits; hex, so it needs no escaping in a proxy URL.
        self.password = os.urandom(32).hex()
        self.record_fd = -1
        self.log_fd = -1
        self.http_port = 0
        self.socks_port = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def credential(self) -> str:
        """``user:password`` for the sandbox's proxy URLs (its own, valid for its policy only)."""
        return f"{self.tenant}:{self.password}"

    def open_record(self, path: str) -> int:
        """A FIFO at ``path`` (0600) the gateway writes this tenant's record to; our read end.

        Opened before the request: the gateway opens it non-blocking, and refuses
        a FIFO nobody reads.
        """
        self.record_fd = _fifo(path)
        return self.record_fd

    def open_log(self, path: str) -> int:
        """The same for the tenant's log lines (refusals, notes): to the session's log."""
        self.log_fd = _fifo(path)
        return self.log_fd

    def broker(self, env: dict[str, str], socket_fd: int) -> Child:
        """The session's broker-server, forked by the service's zygote on our pipes.

        It waits for its arguments on stdin as a deferred boot does
        (:meth:`Child.send_args`), and holds the listening socket ``socket_fd``
        (bound later, :mod:`.handoff`) at that same number, as a spawned broker
        would.  ServiceGone when the service cannot give one.
        """
        import json

        ours: list[int] = []
        theirs: list[int] = []
        try:
            for _ in range(3):
                r, w = os.pipe2(os.O_CLOEXEC)
                ours.append(r)
                theirs.append(w)
            # stdin: they read, we write; stdout and stderr: they write, we read.
            ours[0], theirs[0] = theirs[0], ours[0]
            umask = os.umask(0o077)
            os.umask(umask)
            frame = {"op": "broker", "env": env, "cwd": here(), "umask": umask,
                     "socket_fd": socket_fd}
            data = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
            self.sock.settimeout(10.0)
            self.sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                        b"".join(fd.to_bytes(4, "little")
                                                 for fd in (*theirs, socket_fd)))])
            answer, pidfd = self._answer_with_fd()
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            raise ServiceGone(f"the resident service gave no broker: {exc.strerror}") from None
        except LaunchError:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)
        pid = answer["pid"]
        proc = ForeignProc(pid, pidfd, io.FileIO(ours[0], "wb"), io.FileIO(ours[1], "rb"),
                           io.FileIO(ours[2], "rb"))
        return Child("broker-server", proc, pidfd)  # one pidfd, closed with the Child

    def _answer_with_fd(self) -> tuple[dict[str, Any], int]:
        data = b""
        fds: list[int] = []
        while not data.endswith(b"\n"):
            chunk, anc, _, _ = self.sock.recvmsg(MAX_REPLY, _CMSG_ONE_FD)
            for level, kind, payload in anc:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(payload[i:i + 4], "little")
                            for i in range(0, len(payload) - 3, 4)]
            if not chunk:
                break
            data += chunk
        import json

        try:
            answer = json.loads(data) if data else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("ok") is not True or len(fds) != 1 \
                or not isinstance(answer.get("pid"), int):
            for fd in fds:
                os.close(fd)
            if not data:
                raise ServiceGone("the resident service closed the link")
            error = answer.get("error") if isinstance(answer, dict) else "a malformed answer"
            raise ServiceGone(f"the resident service gave no broker: {error}")
        return answer, fds[0]

    def send(self, policy: dict[str, object], env: dict[str, str]) -> None:
        """The ``session`` request; ServiceGone when the service is not there to read it."""
        import json

        frame = {"op": "session", "tenant": self.tenant, "password": self.password,
                 "policy": policy, "env": env}
        data = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ServiceGone(f"the resident service went away: {exc.strerror}") from None

    def reply(self, timeout: float) -> tuple[int, int]:
        """The gateway's (http, socks) ports for this session; LaunchError when refused."""
        import json

        self.sock.settimeout(timeout)
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = self.sock.recv(MAX_REPLY)
                if not chunk:
                    raise ServiceGone("the resident service closed the link before it answered")
                data += chunk
                if len(data) > MAX_REPLY:
                    raise LaunchError("the resident service's answer is too long")
        except TimeoutError:
            raise LaunchError(f"the resident service ({self.path}) did not answer within "
                              f"{timeout:g}s") from None
        except OSError as exc:
            raise ServiceGone(f"the resident service went away: {exc.strerror}") from None
        finally:
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)
        try:
            answer = json.loads(data)
        except ValueError:
            raise LaunchError("the resident service's answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise LaunchError(f"the resident service refused the session: {error or 'no reason'}")
        http, socks = answer.get("http_port"), answer.get("socks_port")
        if not (isinstance(http, int) and isinstance(socks, int)
                and 0 < http < 65536 and 0 < socks < 65536):
            raise LaunchError("the resident service's answer names no ports")
        self.http_port, self.socks_port = http, socks
        return http, socks

    def gone(self, wait: float = 0.0) -> bool:
        """Whether the service ended the link (end of file or an error on it).

        ``wait``: seconds to wait for that end (a service killed with SIGKILL
        may close its sockets only after its children have had their signal).
        """
        if wait > 0:
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
            poller.poll(int(wait * 1000))
        try:
            return self.sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        """End the registration (the service removes the tenant); the record's end stays."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def close_record(self) -> None:
        """Close our read ends of the tenant's record and log."""
        for fd in (self.record_fd, self.log_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.record_fd = self.log_fd = -1


def _fifo(path: str) -> int:
    os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def connect(path: str | None = None) -> Link | None:
    """A link to the service at ``path`` (default :func:`default_socket`), or None.

    None when nothing listens there (no socket, a stale one, refused), or when
    the listener is of another uid: the caller then starts its own servers.
    """
    path = default_socket() if path is None else path
    if not path:
        return None
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        sock.settimeout(2.0)
        sock.connect(path)
        sock.settimeout(None)
        _, uid = peer_ids(sock)
    except OSError:
        sock.close()
        return None
    if uid != os.getuid():
        sock.close()
        return None
    return Link(sock, path)
