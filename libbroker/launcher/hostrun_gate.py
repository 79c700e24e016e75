"""The live gate: a host process never opens a planted host-run file while the session runs.

The watcher (:mod:`.hostrun_live`) neutralizes after the fact, so a person's
``git status`` looping in another terminal could read a plant before it
acted.  The gate closes that window where the launcher may use fanotify
permission events (CAP_SYS_ADMIN): the workdir, and each repository's
``.git``, are bound onto themselves in the host's mount namespace
(:mod:`.hostrun_binds`), those mounts are marked, and every open or exec of
a file through them waits for this thread's answer.  The sandbox's own
view is another mount: the session's work never waits here.

The launcher's own opens are allowed at once (a thread of ours waiting on
its own gate would never be answered); every other one is judged by
:class:`.hostrun_judge.Judge` (the watcher caught up first, then the rule).
Events name the opening thread (``FAN_REPORT_TID``): a refused create of an
empty ``*.lock`` is noted by its very thread's system call
(:mod:`.hostrun_locks`) and the file removed after the sweep.

A refused open fails with EPERM: the host's git stops with an error, and
never runs the plant.  Any failure here refuses.  If the thread ends, the
group's fd is closed, so the kernel allows what waits and drops the marks:
the watcher and the end sweep remain, and a line says so.  The gate stays
up through the end sweep and is the last to go (:meth:`Gate.stop`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libbroker.launcher import fanotify
from libbroker.launcher.hostrun_binds import Binds
from libbroker.launcher.hostrun_judge import PATIENCE, RECENT, SHOWN, Judge, git_dirs_to_bind
from libbroker.launcher.hostrun_locks import Locks

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_fingerprint import Snapshot
    from libbroker.launcher.hostrun_live import Watcher

__all__ = ["PATIENCE", "RECENT", "SHOWN", "Gate", "describe"]

# The watcher's directories whose connectors the gate's end holds, at most: a mark is a
# few microseconds, and their connectors' own grace period (freed together, after the
# watcher's close) must end before the group's close, a runtime dir's removal later.
HOLD_MAX = 256


class Gate(Judge[fanotify.Event]):
    """One session's gate: :meth:`start` before the sandbox exists, :meth:`stop` last."""

    def __init__(self, snap: Snapshot, watcher: Watcher, record_dir: str) -> None:
        super().__init__(snap, watcher)
        self.binds = Binds(self.workdir, git_dirs_to_bind(snap.repos), record_dir)
        self.fan: fanotify.Fanotify | None = None
        self.pid = os.getpid()
        self.own = 0  # the launcher's own opens that reached the gate (a round trip each)
        self._stopping = False  # stop() closes the group itself, after the binds
        self.held = False  # hold() took the watcher's connectors: stop() keeps the group
        self.locks = Locks(self.workdir)  # empty locks our refused creates left
        self._locks_root = -1  # the workdir beneath the binds, for their removal

    @property
    def under(self) -> dict[str, int]:
        """git dir (relative; "" the workdir) -> an fd on it beneath the binds."""
        return self.binds.under

    def start(self) -> None:
        """The group, its thread, the binds, the marks; OSError (nothing left) if any fails."""
        self.fan = fanotify.Fanotify(report_tid=True)  # the opener's thread: hostrun_locks
        self.start_thread("hostrun-gate")
        try:
            self.binds.make()
            # (binds.remove closes the binds' own before the thread has ended: a refusal
            # at its end is still noted)
            self._locks_root = os.dup(self.binds.under[""])
            for fd in self.binds.mark_fds:
                self.fan.mark_mount(fd)
            self.binds.marked()
        except BaseException:
            self.stop()
            raise
        self.watcher.on_batch = self.wake

    # --- the opens, from the fanotify group ------------------------------------------------

    def _source(self) -> int:
        assert self.fan is not None
        return self.fan.fd

    def _incoming(self) -> list[fanotify.Event]:
        assert self.fan is not None
        return [ev for ev in self.fan.read() if ev.fd >= 0]  # FAN_Q_OVERFLOW: no fd

    def _own(self, ev: fanotify.Event) -> bool:
        # Our own threads (the watcher, the sweep): never waited on.  The event names the
        # thread; /proc/self/task has it only if it is one of ours (it waits on us: alive).
        if ev.pid == self.pid or os.path.exists(f"/proc/self/task/{ev.pid}"):
            self.own += 1
            return True
        return False

    def _facts(self, ev: fanotify.Event) -> tuple[str, bool, int]:
        return (os.readlink(f"/proc/self/fd/{ev.fd}"), bool(ev.mask & fanotify.OPEN_EXEC_PERM),
                ev.pid)

    def _comm(self, ev: fanotify.Event) -> str:
        return _comm(ev.pid)

    def _stat(self, ev: fanotify.Event, rel: str) -> os.stat_result:
        return os.fstat(ev.fd)

    def _digest(self, ev: fanotify.Event, rel: str) -> str:
        from libbroker.launcher.hostrun_fingerprint import digest_of_fd

        return digest_of_fd(ev.fd)

    def _answer(self, ev: fanotify.Event, allow: bool) -> None:
        assert self.fan is not None
        if not allow:  # while its opener still waits in the system call
            self.locks.note(ev.fd, ev.pid)
        try:
            self.fan.answer(ev, allow)
        except OSError as exc:
            self.errors.append(f"answer: {exc.strerror or exc}")

    def _closed(self) -> None:
        if self.fan is not None and not self._stopping:  # (a stop closes it after the binds)
            self.fan.close()

    # --- the end ------------------------------------------------------------------------

    def hold(self, dirs: Sequence[str]) -> None:
        """(The watcher stopped) the group holds the fsnotify connectors of ``dirs``, the
        watched directories, with an inert mark each (:meth:`.Fanotify.hold`), so that
        the watcher's inotify close frees none and waits for an expedited grace period
        alone; then :meth:`stop` keeps the group, :meth:`release` and :meth:`close` end
        it.  Not past :data:`HOLD_MAX` (their marks would cost more than the wait)."""
        if self.fan is None or self.fan.fd < 0 or not dirs or len(dirs) > HOLD_MAX:
            return
        self.held = True  # (from the first mark: the group must outlive the watcher's)
        for path in dirs:
            # Gone, or moved: that close waits longer.  Nothing here may stop the end
            # (the configs' put-back comes next): a mark is only time.
            with contextlib.suppress(Exception):
                self.fan.hold(path)

    def stop(self) -> list[str]:
        """Drop the marks, end the thread (what it holds refused), unbind, close the group
        (the kernel allows what it queued meanwhile; kept open, with nothing marked that
        an open meets, while it holds connectors: :meth:`hold`); the lines to say.

        In this order for the kernel's grace periods (:meth:`.Fanotify.flush_mounts`): the
        marks' connectors are freed by the flush and their SRCU grace period ends while
        the binds are detached, so the close's own wait is an expedited one (measured
        alone: 0.35 ms median, against 7 ms with the close beside the detaches and a
        third of closes at 15 to 19 ms)."""
        self._stopping = True
        if self.fan is not None:
            with contextlib.suppress(OSError):  # (else the close drops them)
                self.fan.flush_mounts()
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        lines = self.binds.remove()
        self.join_thread()
        if not self.held:
            self.close()
        return lines + self.lines() + self._remove_locks()

    def _remove_locks(self) -> list[str]:
        """(After the sweep, the thread ended: nothing is noted any more) the empty locks
        our refused creates left, removed beneath the binds (:mod:`.hostrun_locks`)."""
        root, self._locks_root = self._locks_root, -1
        try:
            return self.locks.remove(root) if root >= 0 and self.locks.noted else []
        finally:
            self.locks.close()
            if root >= 0:
                os.close(root)

    def release(self) -> None:
        """(After the watcher's inotify group is closed) the held connectors freed: their
        grace period runs by itself until :meth:`close`."""
        if self.fan is not None:
            with contextlib.suppress(OSError):
                self.fan.flush_inodes()

    def close(self) -> None:
        """The group closed (last: with nothing marked, an expedited grace period)."""
        if self.fan is not None:
            self.fan.close()


def describe() -> tuple[bool, str, str]:
    """(whether sessions here get a gate, the line ``doctor`` prints about it, its fix):
    the gate in the launcher (root), the gate through the service (an ordinary user whose
    launcher reaches ``agent-sandbox gate-service``), or the watcher alone."""
    from libpolicy.hostrun_gate_service import socket_path

    window = ("a host git looping while a session plants can run a plant before it acts "
              "(docs/hostrun-gate.md has the measured window)")
    if os.environ.get("AGENT_SANDBOX_LIVE_GATE") == "off":
        return False, f"live guard: the watcher alone (AGENT_SANDBOX_LIVE_GATE=off): {window}", \
            "unset AGENT_SANDBOX_LIVE_GATE"
    if fanotify.available():
        return True, ("live guard: the fanotify gate: host processes never open a planted "
                      "host-run file while a session runs (bwrap; Landlock with its own mount "
                      "namespace)"), ""
    path = socket_path(os.environ)
    if not path:
        return False, (f"live guard: the watcher alone (AGENT_SANDBOX_GATE_SOCKET=off; the "
                       f"fanotify gate needs CAP_SYS_ADMIN): {window}"), \
            "unset AGENT_SANDBOX_GATE_SOCKET"
    why = _service_answers(path)
    if not why:
        return True, (f"live guard: the fanotify gate through the gate service at {path}: "
                      "host processes never open a planted host-run file while a session "
                      "runs; an open waits at most 10 s for this user's launcher"), ""
    return False, (f"live guard: the watcher alone (the fanotify gate needs CAP_SYS_ADMIN, and "
                   f"the gate service at {path} {why}): {window}"), (
        "as root, install and start the gate service: contrib/systemd/agent-sandbox-gate"
        ".socket and .service (docs/hostrun-gate.md, \"The service\")")


def _service_answers(path: str) -> str:
    """"" when something accepts a connection at ``path`` (the service), else why not."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect(path)
    except FileNotFoundError:
        return "is not running (no socket)"
    except OSError as exc:
        return f"does not answer ({exc.strerror or exc})"
    finally:
        sock.close()
    return ""


def _comm(pid: int) -> str:
    """The process's name (it waits on us: its pid cannot be reused meanwhile)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
