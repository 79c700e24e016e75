"""``agent-sandbox gate-service``: the live gate for ordinary users' sessions (root).

fanotify permission events and mount marks need CAP_SYS_ADMIN, so a launcher
of an ordinary user cannot gate its own workdir (docs/hostrun-gate.md).  This
service, run as root (contrib/systemd/agent-sandbox-gate.{socket,service}),
does it for them: a launcher connects on a unix socket (default
:data:`DEFAULT_SOCKET`, mode 0666: any user may ask, for directories it
owns), passes ``O_PATH`` fds of its workdir and each ``.git``, and the
service binds and marks them in its mount namespace (the host's) and answers
the kernel for each open through them, asking the launcher about its user's
opens (:mod:`.gate_service_conn`, one thread per session).

What the service trusts: the kernel's word on the peer (``SO_PEERCRED``, a
pidfd) and on the directories (their fds, their inodes, the kernel's names);
nothing the client writes but the number of directories and its yes or no on
its own user's opens.  What it refuses, with one line in its log each: root,
a directory not owned by the peer's uid, a name with a link on it, a ``.git``
not beneath the workdir, ``/``, a mount point, a workdir inside or around one
gated now, more than :data:`~libpolicy.hostrun_gate_service.MAX_DIRS`
directories, :data:`MAX_SESSIONS` sessions or :data:`MAX_PER_UID` of one user, a
frame that is not one, a request not made within 5 s.

The binds of each session are recorded before each mount in a directory of
the service's (``gate-sessions/N`` beside the socket): a service that died
(``kill -9``) left them, and its next start unbinds them
(:func:`.hostrun_binds.repair`) before it listens.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import stat
import threading

from libbroker.errors import LaunchError, UsageError
from libbroker.launcher import fanotify, hostrun_binds
from libbroker.launcher.gate_service_conn import Conn
from libbroker.launcher.hostrun_judge import PATIENCE
from libbroker.launcher.serve_link import peer_ids
from libbroker.unix_listen import listen_for_service
from libpolicy.hostrun_gate_service import DEFAULT_SOCKET, SOCKET_ENV, socket_path

MAX_SESSIONS = 64  # gated at once, all users
_CAP_SYS_PTRACE = 19  # /proc/TID/syscall of another uid's thread (hostrun_locks)
MAX_PER_UID = 16  # of one user: no user takes every place


def listen_path() -> str:
    """Where the service listens without --socket: where launchers look."""
    return socket_path(os.environ) or DEFAULT_SOCKET


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"agent-sandbox gate-service: {line}\n".encode(errors="replace"))


def _root_dir(path: str) -> None:
    """``path`` a directory of root's that no one else may write (made 0755 if missing)."""
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise UsageError(f"{path} is not a directory of root's that only root may write")


def _listen(path: str) -> tuple[socket.socket, bool]:
    """The listening socket (systemd's, else bound at ``path``: True)."""
    from libbroker.launcher.serve import activated_socket

    sock = activated_socket()
    if sock is not None:
        return sock, False
    _root_dir(os.path.dirname(path))
    sock = listen_for_service(path, _say)
    os.chmod(path, 0o666)  # noqa: S103 any user may ask; what it asks for is checked by its fds
    return sock, True


class Service:
    def __init__(self, listener: socket.socket, records: str, patience: float) -> None:
        self.listener = listener
        self.records = records
        self.patience = patience
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._conns: dict[int, tuple[Conn, threading.Thread]] = {}
        self._number = 0

    def gated(self) -> list[str]:
        with self._lock:
            return [c.workdir for c, _ in self._conns.values() if c.binds is not None]

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                break
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            self._start(sock)
        with self._lock:
            running = list(self._conns.values())
        for _, thread in running:  # each one unbinds on seeing the stop
            thread.join(timeout=30)

    def _start(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        try:
            _, uid = peer_ids(sock)
        except OSError:
            sock.close()
            return
        with self._lock:
            self._reap()
            mine = sum(1 for c, _ in self._conns.values() if c.uid == uid)
            if len(self._conns) >= MAX_SESSIONS or mine >= MAX_PER_UID:
                _say(f"refused a connection of uid {uid}: {len(self._conns)} sessions are "
                     f"gated, {mine} of them its own (at most {MAX_SESSIONS}, "
                     f"{MAX_PER_UID} per user)")
                sock.close()
                return
            self._number += 1
            conn = Conn(sock, self._number, self.records, self.patience, self._stop_r,
                        self.gated, _say)
            conn.uid = uid
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                      name=f"gate-{self._number}")
            self._conns[self._number] = (conn, thread)
        thread.start()

    def _serve(self, conn: Conn) -> None:
        try:
            conn.run()
        finally:
            with self._lock:
                self._conns.pop(conn.number, None)

    def _reap(self) -> None:
        for number, (_, thread) in list(self._conns.items()):
            if not thread.is_alive():
                del self._conns[number]


def main(path: str, patience: float = PATIENCE) -> int:
    """Serve until SIGTERM/SIGINT (0); every session's binds go first."""
    if not fanotify.available():
        raise LaunchError("gate-service needs CAP_SYS_ADMIN: run it as root (the unit in "
                          "contrib/systemd/agent-sandbox-gate.service does)")
    if not path.startswith("/"):
        raise UsageError(f"--socket {path}: an absolute path is needed")
    listener, bound = _listen(path)
    _say(f"({SOCKET_ENV} names this socket for launchers; default {DEFAULT_SOCKET})")
    records = os.path.join(os.path.dirname(path), "gate-sessions")
    os.makedirs(records, mode=0o700, exist_ok=True)
    dead = [os.path.join(records, n) for n in sorted(os.listdir(records))]
    for line in hostrun_binds.repair(dead):  # a service killed with its sessions' binds
        _say(line.removeprefix("agent-sandbox: "))
    for one in dead:
        with contextlib.suppress(OSError):
            os.rmdir(one)
    if not fanotify.has_capability(_CAP_SYS_PTRACE):
        _say("without CAP_SYS_PTRACE: a refused create's empty lock file (.git/index.lock) "
             "is not known as one and stays (docs/hostrun-gate.md)")
    service = Service(listener, records, patience)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop())
    _say(f"listening on {path}")
    try:
        service.run()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if bound and stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
    _say("stopped")
    return 0
