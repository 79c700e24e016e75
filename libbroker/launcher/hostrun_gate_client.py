"""An ordinary user's live gate, held by the gate service (``agent-sandbox gate-service``).

A launcher without CAP_SYS_ADMIN cannot make a fanotify permission group, so
it asks the root service (docs/hostrun-gate.md, "The service") when its
socket exists: it passes ``O_PATH`` fds of its workdir and each ``.git``; the
service proves them, binds and marks them in the host's mount namespace, and
for each open through the marks by this user's processes (not the launcher's
own, not another uid's) sends a request: the kernel's name of the file, exec
or open, the opener's pid and name, the file's stat, never a descriptor.
This thread judges it as the launcher's own gate would
(:class:`.hostrun_judge.Judge`), its reads going beneath the binds through
the fds taken before them (:attr:`ServiceGate.under`), and answers.  The
service refuses an open whose answer does not come within its patience (a
stopped launcher): no host open waits without bound.  When the connection
goes (the launcher's death), the service closes its group (what waits is
allowed, as after the death of a root launcher) and unbinds.  At a ``stop``
it names the empty lock files that creates it refused left, each pinned
(:mod:`.hostrun_locks`); this launcher removes them beneath the binds with
its own credentials, if each is still that very empty inode, and says
``done``.
"""

from __future__ import annotations

import _socket  # not socket.py: this module loads on every session's start (its cost)
import contextlib
import os
import threading
from typing import TYPE_CHECKING

from libbroker.launcher.hostrun_binds import open_beneath
from libbroker.launcher.hostrun_judge import PATIENCE, Judge, git_dirs_to_bind
from libbroker.named_tuple import NamedTuple
from libpolicy import hostrun_gate_service as proto

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_fingerprint import Snapshot
    from libbroker.launcher.hostrun_live import Watcher

READY_TIMEOUT = 30.0  # the service binds and marks: milliseconds per repository
_O_UNDER = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class GateRefused(Exception):
    """The service would not gate this session: its one line."""


class Ask(NamedTuple):
    id: int
    pid: int
    comm: str
    exec: bool
    path: str
    stat: os.stat_result


def _ask(frame: dict[str, object]) -> Ask:
    """The service's request, checked (FrameError otherwise)."""
    st = frame.get("stat")
    fields = (frame.get("id"), frame.get("pid"), frame.get("comm"), frame.get("exec"),
              frame.get("path"))
    if not (isinstance(fields[0], int) and isinstance(fields[1], int)
            and isinstance(fields[2], str) and isinstance(fields[3], bool)
            and isinstance(fields[4], str) and isinstance(st, list) and len(st) == 6
            and all(isinstance(n, int) for n in st)):
        raise proto.FrameError("an 'ask' of the wrong shape")
    dev, ino, mode, size, mtime, ctime = st
    stat = os.stat_result((mode, ino, dev, 0, 0, 0, size, 0, 0, 0),
                          {"st_mtime_ns": mtime, "st_ctime_ns": ctime})
    return Ask(fields[0], fields[1], fields[2], fields[3], fields[4], stat)


def _locks(said: object) -> list[tuple[str, int, int, str]]:
    """The ``stopped`` frame's locks, those of the right shape (relative names only)."""
    out = []
    for one in said if isinstance(said, list) else []:
        if (isinstance(one, list) and len(one) == 4 and isinstance(one[0], str)
                and isinstance(one[1], int) and isinstance(one[2], int)
                and isinstance(one[3], str) and one[0] and not one[0].startswith("/")
                and ".." not in one[0].split("/")):
            out.append((one[0], one[1], one[2], one[3]))
    return out


class ServiceGate(Judge[Ask]):
    """The session's gate through the service: :meth:`start` before the sandbox, :meth:`stop`
    last."""

    def __init__(self, snap: Snapshot, watcher: Watcher, path: str) -> None:
        super().__init__(snap, watcher)
        self.path = path
        self.git_dirs = git_dirs_to_bind(snap.repos)
        self.under: dict[str, int] = {}  # fds taken before the binds: beneath them
        self.sock: _socket.socket | None = None
        self.service_lines: list[str] = []
        self.locks: list[tuple[str, int, int, str]] = []  # (rel, dev, ino, comm): the service's
        self._inbox = b""
        self._send_lock = threading.Lock()
        self._over = False  # the service said "stopped": nothing more to send

    def start(self) -> None:
        """Connect, hand over the directories, wait for the binds; OSError or
        :class:`GateRefused` (nothing left) if the service does not gate."""
        try:
            self._open_dirs()
            from array import array

            self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self.sock.settimeout(READY_TIMEOUT)
            self.sock.connect(self.path)
            fds = array("i", [self.under[""], *(self.under[g] for g in self.git_dirs)])
            self.sock.sendmsg([proto.encode({"op": "gate", "dirs": len(fds)})],
                              [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            reply = self._frame()
            if reply.get("op") == "refused":
                raise GateRefused(str(reply.get("why", "")))
            if reply.get("op") != "ready" or reply.get("workdir") != self.workdir:
                raise GateRefused(f"an unexpected reply ({str(reply.get('op'))[:40]})")
        except BaseException:
            self._close()
            raise
        self.sock.settimeout(5.0)  # a send to a service that reads no more: its end
        self.start_thread("hostrun-gate-service")
        self.watcher.on_batch = self.wake

    def _open_dirs(self) -> None:
        self.under[""] = os.open(self.workdir, _O_UNDER)
        for rel in self.git_dirs:
            self.under[rel] = open_beneath(self.under[""], rel, _O_UNDER)

    def _frame(self) -> dict[str, object]:
        """One frame, blocking (the start's reply)."""
        assert self.sock is not None
        head = self._exactly(proto.HEADER)
        return proto.decode(self._exactly(proto.length(head)))

    def _exactly(self, n: int) -> bytes:
        assert self.sock is not None
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise GateRefused("the service closed the connection")
            data += chunk
        return data

    # --- the opens, from the service ----------------------------------------------------

    def _source(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def _incoming(self) -> list[Ask] | None:
        assert self.sock is not None
        chunk = self.sock.recv(1 << 16, _socket.MSG_DONTWAIT)
        if not chunk:
            self.died = self.died or "the gate service closed the connection"
            return None
        self._inbox += chunk
        out = []
        while len(self._inbox) >= proto.HEADER:
            n = proto.length(self._inbox[:proto.HEADER])
            if len(self._inbox) < proto.HEADER + n:
                break
            frame = proto.decode(self._inbox[proto.HEADER:proto.HEADER + n])
            self._inbox = self._inbox[proto.HEADER + n:]
            if frame["op"] == "stopped":
                said = frame.get("lines")
                self.service_lines = [str(x) for x in said] if isinstance(said, list) else []
                self.locks = _locks(frame.get("locks"))
                self._over = True
                return None
            out.append(_ask(frame))
        return out

    def _facts(self, ask: Ask) -> tuple[str, bool, int]:
        return ask.path, ask.exec, ask.pid

    def _comm(self, ask: Ask) -> str:
        return ask.comm

    def _stat(self, ask: Ask, rel: str) -> os.stat_result:
        return ask.stat

    def _digest(self, ask: Ask, rel: str) -> str:
        """Our own read of the file, beneath the binds, only if it is the inode opened."""
        from libbroker.launcher.hostrun_fingerprint import digest_of_fd

        fd = open_beneath(self.under[""], rel, _O_READ)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (ask.stat.st_dev, ask.stat.st_ino):
                return ""
            return digest_of_fd(fd)
        finally:
            os.close(fd)

    def _answer(self, ask: Ask, allow: bool) -> None:
        self._send({"op": "answer", "id": ask.id, "allow": allow})

    def _send(self, frame: dict[str, object]) -> None:
        with self._send_lock:
            if self.sock is None or self._over:
                return
            try:
                self.sock.sendall(proto.encode(frame))
            except OSError as exc:
                self.errors.append(f"send: {exc.strerror or exc}")

    # --- the end ------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Ask the service to unbind and wait for it (the thread answers meanwhile); lines."""
        self._send({"op": "stop"})
        if self._thread is not None:
            self._thread.join(PATIENCE + 20)
        self.stop_thread()
        removed = self._remove_locks() if self._over else []
        self._close()
        return self.service_lines + self.lines() + removed

    def _remove_locks(self) -> list[str]:
        """The empty locks the service's refusals left (it pins them until our ``done``),
        removed beneath the binds (:func:`.hostrun_locks.remove`); a line each."""
        from libbroker.launcher.hostrun_locks import remove_each

        if not self.locks or self.sock is None:
            return []
        lines, gone = remove_each(self.under[""], self.locks)
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(proto.encode({"op": "done", "removed": gone}))
        return lines

    def _close(self) -> None:
        if self.sock is not None:
            with self._send_lock:
                self.sock.close()
                self.sock = None
        for fd in self.under.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.under = {}

