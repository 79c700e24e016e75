"""One interface over the sandbox backends (the choice between them: :mod:`.executor_choice`).

An :class:`Executor` starts one command in a fresh sandbox with the three
stdio fds it is given and returns a :class:`Child`.  The server owns the
child from then on: it waits for it (through a pidfd), forwards signals to it,
and kills and releases it on every path.
"""

from __future__ import annotations

import contextlib
import os
import signal
from abc import ABC, abstractmethod

from libbroker.sandbox import cgroup_report, cgroups
from libbroker.sandbox.limits import Limits


class Child(ABC):
    """A started command: the process to wait for and its process group."""

    pid: int
    group: cgroups.Group | None = None  # a sandboxed command's limits, removed on release

    @abstractmethod
    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` to the command's process group (not the sandbox's helpers)."""

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL everything the command started that the backend can reach."""

    def release(self) -> None:
        """Free per-command resources once the child is reaped: its limits' group here
        (nothing of the command is left), its private tmp and fds in the backends'."""
        if self.group is not None:
            cgroups.remove(self.group, timeout=0)
            self.group = None

    def limits_hit(self) -> list[str]:
        """Each resource limit the command hit (``task limit (64): 3 forks were refused``)."""
        return cgroup_report.report(self.group) if self.group is not None else []


class Executor(ABC):
    """Starts commands in a fresh sandbox each."""

    name: str
    timeout: float | None = None  # wall-clock seconds per command (the profile's limits)

    @abstractmethod
    def spawn(self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int]) -> Child:
        """Start ``argv`` in ``cwd`` with fds 0, 1, 2 from ``stdio``; raise SpawnError."""

    def describe(self) -> str:
        """A one-line summary for the startup message."""
        return self.name

    def close(self) -> None:
        """Free what the executor holds (the limits' groups still going; its tmp base in the
        Landlock backend's) when the server stops."""
        cgroups.flush_pending(timeout=2.0)

    def _start_limits(self, limits: Limits) -> None:
        """Each command's limits from the profile: the mechanism found once, and the groups
        of a server killed before it cleaned up reclaimed."""
        self.timeout = limits.timeout
        self.mechanism = cgroups.mechanism()
        cgroups.reclaim(self.mechanism)
        self._spawned = 0

    def _new_group(self, limits: Limits) -> cgroups.Group:
        """The next command's limits (OSError if they cannot be set)."""
        self._spawned += 1
        return cgroups.create(limits, str(self._spawned), self.mechanism)


def killpg_quietly(pgid: int, signum: int) -> None:
    """``killpg`` that ignores a group already gone (and a signal number the kernel refuses)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signum)


_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def restore_child_signals() -> None:
    """Undo what Python did to signal dispositions, in a forked child before exec.

    Python ignores SIGPIPE (so ``yes | head`` would never end in the child) and
    the server routes signals through a wake-up fd it shares with the child.
    """
    signal.set_wakeup_fd(-1)
    for signum in _RESET_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
