"""One launcher's connection to the gate service: its binds, its marks, its opens' answers.

Runs in a thread of ``agent-sandbox gate-service`` (root), from the accept to
the end, and never raises.  In order:

1. the peer: ``SO_PEERCRED`` and a pidfd of the process that connected
   (:func:`.serve_peer.peer_pidfd`);
2. one ``gate`` frame with its descriptors, within the patience;
3. the directories proven by their fds (:mod:`.gate_service_dirs`); only then
   anything that needs root: the binds (:class:`.hostrun_binds.Binds`, recorded
   in a directory of the service's), a fanotify group and its mount marks;
4. the loop: each open through the marks is routed by
   :func:`libpolicy.hostrun_gate_service.route` (the opening *thread's* fsuid:
   another uid's open is allowed at once, the launcher's own too); the rest is
   asked of the launcher as names and numbers, never a descriptor; no answer
   within ``patience`` seconds (a stopped launcher) is a refusal;
5. the end (``stop``, the connection or the launcher's process gone, the
   service stopping): what waits is refused, the group closed, the binds
   detached through the fds held on them;
6. after a ``stop``, the empty lock files that refused creates left
   (:mod:`.hostrun_locks`: noted before each refusal, pinned) are named in
   the ``stopped`` frame; the launcher removes them with its own
   credentials (root writes nothing in a user's directory) and says
   ``done``; the pins are held until then (their inodes' numbers stay theirs).

Every refusal of a request is one line in the service's log and one
``refused`` frame to the client, when it still listens.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from libbroker.launcher import fanotify, serve_peer
from libbroker.launcher.gate_service_dirs import Refused, Verified, verify
from libbroker.launcher.hostrun_binds import Binds
from libbroker.launcher.hostrun_locks import Locks
from libbroker.launcher.serve_link import peer_ids
from libpolicy import hostrun_gate_service as proto

if TYPE_CHECKING:
    from typing import Any

SEND_TIMEOUT = 5.0  # a reply the client does not read
MAX_OUTBOX = 1 << 20  # asks the launcher has not read: beyond, new ones are refused at once


class Ended(Exception):
    """The conversation is over (the reason is the message)."""


class Conn:
    def __init__(self, sock: socket.socket, number: int, records: str, patience: float,
                 stop_fd: int, gated: Callable[[], list[str]], log: Callable[[str], None]) -> None:
        self.sock = sock
        self.number = number
        # unique across the service's lives: a dead one's record may still be there
        self.record_dir = os.path.join(records, f"{os.getpid()}-{number}")
        self.patience = patience
        self.stop_fd = stop_fd
        self.gated = gated
        self.log = log
        self.uid = -1
        self.pid = -1
        self.pidfd = -1
        self.workdir = ""
        self.fan: fanotify.Fanotify | None = None
        self.binds: Binds | None = None
        self.locks: Locks | None = None  # empty locks our refused creates left
        self.pending: dict[int, tuple[fanotify.Event, float]] = {}
        self.counts = {"allowed at once": 0, "asked": 0, "refused unanswered": 0,
                       "refused unidentified": 0}
        self._ids = 0
        self._deadline = 0.0
        self._inbox = b""
        self._outbox = b""

    def who(self) -> str:
        return f"session {self.number} (uid {self.uid}, pid {self.pid})"

    def run(self) -> None:
        how = "ended"
        try:
            self._peer()
            found = self._hello()
            try:
                self._bind(found)
            finally:
                found.close()
            self.log(f"{self.who()}: gating {self.workdir!r} and {len(found.gits)} .git")
            self._send({"op": "ready", "workdir": self.workdir,
                        "gits": len(self.binds.git_dirs) if self.binds else 0})
            how = self._loop()
        except (Refused, proto.FrameError) as exc:
            self.log(f"{self.who()}: refused: {exc}")
            with contextlib.suppress(OSError, proto.FrameError):
                self._send({"op": "refused", "why": str(exc)})
            how = "refused"
        except Ended as exc:
            how = str(exc)
        except Exception as exc:  # never the service's end: this session's only
            self.log(f"{self.who()}: failed: {type(exc).__name__}: {exc}")
            how = "failed"
        finally:
            lines = self._end()
            if how == "stop":
                self._stopped(lines)
            if self.locks is not None:
                self.locks.close()
            for line in lines:
                self.log(f"{self.who()}: {line}")
            if self.workdir:
                said = ", ".join(f"{k} {n}" for k, n in self.counts.items())
                self.log(f"{self.who()}: ended ({how}): {said}")
            self.sock.close()
            if self.pidfd >= 0:
                os.close(self.pidfd)

    # --- before anything of root's ------------------------------------------------------

    def _peer(self) -> None:
        try:
            self.pid, self.uid = peer_ids(self.sock)
            self.pidfd, _ = serve_peer.peer_pidfd(self.sock, self.pid)
        except OSError as exc:
            raise Refused(f"the peer cannot be identified ({exc.strerror})") from None

    def _hello(self) -> Verified:
        """The request and its fds, all within the patience (a client that drips its bytes
        holds a place no longer than one that sends nothing)."""
        self._deadline = time.monotonic() + self.patience
        self.sock.settimeout(self.patience)
        fds: list[int] = []
        try:
            try:
                head, fds, flags, _ = socket.recv_fds(self.sock, proto.HEADER, proto.MAX_DIRS,
                                                      socket.MSG_CMSG_CLOEXEC)
            except (TimeoutError, OSError) as exc:
                raise Refused(f"no request ({exc})") from None
            if flags & socket.MSG_CTRUNC:
                raise Refused(f"more than {proto.MAX_DIRS} descriptors")
            if not head:
                raise Ended("gone before its request")
            head += self._exactly(proto.HEADER - len(head))
            frame = proto.decode(self._exactly(proto.length(head)))
            proto.request(frame, ("gate",))
            if frame["dirs"] != len(fds):
                raise Refused(f"'gate' says {frame['dirs']} directories and came with "
                              f"{len(fds)} descriptors")
            return verify(fds, self.uid, self.gated())
        finally:
            for fd in fds:
                os.close(fd)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            try:
                self.sock.settimeout(max(0.001, self._deadline - time.monotonic()))
                chunk = self.sock.recv(n - len(data))
            except (TimeoutError, OSError) as exc:
                raise Refused(f"a frame cut short ({exc})") from None
            if not chunk:
                raise Refused("a frame cut short (end of file)")
            data += chunk
        return data

    # --- root's part, after validation ---------------------------------------------------

    def _bind(self, found: Verified) -> None:
        os.makedirs(self.record_dir, mode=0o700)
        self.workdir = found.workdir
        self.locks = Locks(found.workdir, owner=self.uid)
        self.binds = Binds(found.workdir, found.gits, self.record_dir, opened=found.opened,
                           hold=True)
        self.fan = fanotify.Fanotify(report_tid=True)
        try:
            self.binds.make()
            for fd in self.binds.mark_fds:
                self.fan.mark_mount(fd)
        except OSError as exc:
            raise Refused(f"the binds or marks failed: {exc.strerror or exc}") from None

    def _loop(self) -> str:
        assert self.fan is not None
        self.sock.setblocking(False)
        poller = select.poll()
        for fd in (self.fan.fd, self.sock.fileno(), self.pidfd, self.stop_fd):
            poller.register(fd, select.POLLIN)
        while True:
            poller.modify(self.sock, select.POLLIN | (select.POLLOUT if self._outbox else 0))
            wait = None
            if self.pending:
                due = min(deadline for _, deadline in self.pending.values())
                wait = max(0, int((due - time.monotonic()) * 1000) + 1)
            ready = dict(poller.poll(wait))
            if self.stop_fd in ready:
                return "the service stops"
            if self.pidfd in ready:
                return "the launcher exited"
            if self.fan.fd in ready:
                for ev in self.fan.read():
                    self._take_one(ev)
            if self.sock.fileno() in ready:
                if ready[self.sock.fileno()] & select.POLLOUT:
                    self._flush()
                readable = select.POLLIN | select.POLLHUP | select.POLLERR
                if ready[self.sock.fileno()] & readable and self._read():
                    return "stop"
            self._expire()

    def _take_one(self, ev: fanotify.Event) -> None:
        """One event; one that cannot be handled (its fd's stat or name fails) is refused,
        never the session's end (the connection's loss still ends it)."""
        try:
            self._take(ev)
        except Ended:
            raise
        except Exception as exc:
            self.counts["refused unidentified"] += 1
            self.log(f"{self.who()}: an open refused: {type(exc).__name__}: {exc}")
            self._answer(ev, False)

    def _take(self, ev: fanotify.Event) -> None:
        if ev.fd < 0:
            return
        fsuid, tgid, comm = _creds(ev.pid)
        way = proto.route(fsuid=fsuid, tgid=tgid, session_uid=self.uid, launcher=self.pid)
        if way == proto.ALLOW:
            self.counts["allowed at once"] += 1
            self._answer(ev, True)
            return
        if way == proto.REFUSE or len(self._outbox) > MAX_OUTBOX:
            self.counts["refused unidentified" if way == proto.REFUSE else
                        "refused unanswered"] += 1
            self._answer(ev, False)
            return
        self._ids += 1
        st = os.fstat(ev.fd)
        ask = {"op": "ask", "id": self._ids, "pid": tgid, "comm": comm,
               "exec": bool(ev.mask & fanotify.OPEN_EXEC_PERM),
               "path": os.readlink(f"/proc/self/fd/{ev.fd}"),
               "stat": [st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns,
                        st.st_ctime_ns]}
        data = proto.encode(ask)  # everything that may fail, before the event is pending
        self.pending[self._ids] = (ev, time.monotonic() + self.patience)
        self.counts["asked"] += 1
        self._outbox += data
        self._flush()

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self._outbox)
        except BlockingIOError:
            return
        except OSError as exc:
            raise Ended("the connection was lost") from exc
        self._outbox = self._outbox[sent:]

    def _read(self) -> bool:
        """The launcher's frames now readable; True on ``stop``."""
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise Ended("the connection was lost") from exc
        if not chunk:
            raise Ended("the connection was lost")
        self._inbox += chunk
        while (frame := self._next_frame(("answer", "stop"))) is not None:
            if frame["op"] == "stop":
                return True
            held = self.pending.pop(frame["id"], None)
            if held is not None:  # else answered already (too late): nothing to do
                self._answer(held[0], frame["allow"])
        return False

    def _next_frame(self, ops: tuple[str, ...]) -> dict[str, Any] | None:
        """The next whole frame in the inbox, checked to be one of ``ops`` (FrameError if
        not); None until one has arrived whole."""
        if len(self._inbox) < proto.HEADER:
            return None
        n = proto.length(self._inbox[:proto.HEADER])
        if len(self._inbox) < proto.HEADER + n:
            return None
        frame = proto.request(proto.decode(self._inbox[proto.HEADER:proto.HEADER + n]), ops)
        self._inbox = self._inbox[proto.HEADER + n:]
        return frame

    def _expire(self) -> None:
        now = time.monotonic()
        for key, (ev, deadline) in list(self.pending.items()):
            if now >= deadline:
                del self.pending[key]
                self.counts["refused unanswered"] += 1
                self._answer(ev, False)

    def _answer(self, ev: fanotify.Event, allow: bool) -> None:
        assert self.fan is not None
        if not allow and self.locks is not None:  # while its opener still waits
            self.locks.note(ev.fd, ev.pid)
        with contextlib.suppress(OSError):  # the opener was killed meanwhile
            self.fan.answer(ev, allow)

    def _send(self, obj: dict[str, object]) -> None:
        self.sock.settimeout(SEND_TIMEOUT)
        self.sock.sendall(proto.encode(obj))

    # --- the end --------------------------------------------------------------------------

    def _stopped(self, lines: list[str]) -> None:
        """``stopped`` (the lines, the noted locks); with locks, the launcher's ``done``
        awaited within the patience, the pins held meanwhile."""
        noted, size = [], 0
        for n in self.locks.noted if self.locks is not None else []:
            size += len(proto.encode({"l": [n.rel, n.dev, n.ino, n.comm]}))
            if size > proto.MAX_FRAME // 2:  # the frame's bound (the rest stays, said)
                break
            noted.append(n)
        removed: list[str] = []
        with contextlib.suppress(OSError, proto.FrameError):
            self.sock.setblocking(True)
            self.sock.settimeout(5)
            self.sock.sendall(proto.encode({
                "op": "stopped", "lines": lines,
                "locks": [[n.rel, n.dev, n.ino, n.comm] for n in noted]}))
            if noted:
                removed = self._done()
        for n in self.locks.noted if self.locks is not None else []:
            self.log(f"{self.who()}: {n.rel!r}, the empty lock file a refused create left: "
                     f"the launcher {'removed' if n.rel in removed else 'left'} it")

    def _done(self) -> list[str]:
        """The launcher's ``done`` (late answers skipped): the names it removed."""
        deadline = time.monotonic() + self.patience
        while True:
            while (frame := self._next_frame(("answer", "done"))) is not None:
                if frame["op"] == "done":
                    return [r for r in frame["removed"] if isinstance(r, str)]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return []
            if not chunk:
                return []
            self._inbox += chunk

    def _end(self) -> list[str]:
        lines: list[str] = []
        if self.fan is not None:
            # The marks first, the group closed after the binds: its close's grace period
            # is then an expedited one (fanotify.Fanotify.flush_mounts).
            with contextlib.suppress(OSError):
                self.fan.flush_mounts()
            for ev, _ in self.pending.values():
                self._answer(ev, False)
            self.pending = {}
        try:
            if self.binds is not None:
                lines = self.binds.remove()
                self.binds = None  # not gated any more (Service.gated)
        finally:
            if self.fan is not None:
                self.fan.close()  # the kernel allows whatever still waits
        if not lines:
            shutil.rmtree(self.record_dir, ignore_errors=True)
        return lines


def _creds(tid: int) -> tuple[int | None, int | None, str]:
    """(fsuid, tgid, name) of the thread that opened, from one read of its status (it waits
    on us: its id is not reused meanwhile)."""
    fsuid = tgid = None
    name = ""
    try:
        with open(f"/proc/{tid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Name:"):  # the comm, escaped by the kernel
                    name = line[5:].strip().decode(errors="replace")
                elif line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith(b"Uid:"):
                    fsuid = int(line.split()[4])
                    break
    except (OSError, ValueError, IndexError):
        return None, None, ""
    return fsuid, tgid, name
