"""The launcher's children: start, wait for ``listening``, stop in order, reap.

Ownership rules (trio's, with processes):

- every child is started by the main thread (``posix_spawn``, :mod:`.child`)
  and gets ``PR_SET_PDEATHSIG``, so the kernel signals it if the launcher
  dies, even by SIGKILL: our Python programs set it first thing in their boot
  (:func:`.boot.die_with`), bwrap gets ``--die-with-parent``, which is the
  same thing;
- every child gets a pidfd, so waits are exact (poll, no sleep loops) and a
  signal can never reach a recycled pid;
- the :class:`Janitor`, a small process that only waits on a pipe,
  finishes the job when the launcher is killed: it ends what is left of
  the session and removes the runtime directory.  On every other path the
  launcher does that itself and dismisses the janitor;
- the :class:`Crew` holds a session's children (the servers, the sandbox) and
  ends them in order, the sandbox first; the :class:`Signals` the launcher
  catches wait there until the session passes them to CMD.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from libbroker.errors import LaunchError
from libbroker.launcher import boot
from libbroker.launcher.child import Child as Child
from libbroker.launcher.child import spawn as spawn
from libbroker.launcher.child import start

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import signal
else:
    # The C module: signal.py's enum conversions cost the launcher ~1 ms of
    # CPU while the servers start, and nothing here needs its enums.
    import _signal as signal

# How long the sandbox gets between SIGTERM and SIGKILL at the end of a session.
GRACE = 3.0
# The signals the launcher takes for CMD (passed on, or left to a terminal's group).
FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Janitor:
    """A watcher process that cleans up after a launcher killed by SIGKILL.

    The launcher tells it each child's pid (it opens a pidfd at once, so pid
    reuse cannot fool it).  End of file without the "done" word means the
    launcher died: it ends the children (SIGTERM, a grace, SIGKILL, sandbox
    first) and removes the runtime directory (:mod:`.janitor`).

    It is a fresh interpreter, not a fork of the launcher: a forked twin
    living through the session would make every page the launcher writes a
    copy-on-write fault, tens of ms of system time while the servers start.
    """

    def __init__(self, runtime_dir: str) -> None:
        import sys

        r, w = os.pipe()
        module = "libbroker.launcher.janitor"
        slow = [os.path.realpath(sys.executable), "-I", "-m", module]
        argv = [*boot.python_argv("agent-sandbox-janitor", module, slow), str(r), runtime_dir]
        try:
            self._proc = start(
                argv,
                stdin="devnull",
                output="devnull",
                pass_fds=(r,),
                setpgroup=True,  # out of the terminal's foreground group: no tty signals
            )
        except OSError as exc:
            os.close(w)
            raise LaunchError(f"cannot start the session's janitor: {exc.strerror}") from None
        finally:
            os.close(r)
        self._w = w
        # Its interpreter start (~20 ms of CPU) is of no use before the
        # launcher dies: at the lowest priority it runs when a core is free
        # (once the broker listens) instead of taking the servers' share.
        # Its work starts only when the launcher is gone, idle cores or not.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, self._proc.pid, 19)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def watch(self, child: Child) -> None:
        os.write(self._w, f"{child.pid} {int(child.own_group)}\n".encode())

    def dismiss(self) -> None:
        """The launcher cleaned up itself: let the janitor go and reap it."""
        with contextlib.suppress(OSError):
            os.write(self._w, b"done\n")
        os.close(self._w)
        self._proc.wait()


class Crew:
    """A session's children, each watched by the janitor once it runs; ended in order.

    ``children`` keeps their start order (egress-proxy first): the servers
    end last started first.  ``sandbox`` is one of them, the session's CMD.
    """

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.sandbox: Child | None = None
        self.janitor: Janitor | None = None

    def take(self, *children: Child | None) -> None:
        """Children started before the janitor (prestarted servers): see :meth:`watch_all`."""
        self.children += [c for c in children if c is not None]

    def watch_all(self) -> None:
        """The janitor knows every child from here on."""
        assert self.janitor is not None
        for child in self.children:
            self.janitor.watch(child)

    def adopt(self, child: Child, *, first: bool = False) -> None:
        """A child the session owns from now on (``first``: ended last)."""
        if first:
            self.children.insert(0, child)
        else:
            self.children.append(child)
        assert self.janitor is not None
        self.janitor.watch(child)

    def spawn(self, name: str, argv: list[str], *, own_group: bool = False,
              **kw: object) -> Child:
        child = spawn(name, argv, **kw)  # type: ignore[arg-type]
        child.own_group = own_group
        self.adopt(child)
        return child

    def by_pidfd(self, fd: int) -> Child | None:
        return next((c for c in self.children if c.pidfd == fd), None)

    def exited(self, *, but: Child | None = None) -> Child | None:
        """The first child (not ``but``) that has exited, if any."""
        return next((c for c in self.children if c is not but and c.exited()), None)

    def end(self, ask: Callable[[int], None], between: Callable[[], None]) -> None:
        """The sandbox (``ask`` passes it a signal), then the servers; idempotent.

        Then the broker (its clients are gone with the sandbox), then the
        proxy.  A server with nothing in flight (no child process: no
        brokered command, no token command) holds no state of its own, so
        SIGKILL ends it at once; a busy one gets SIGTERM to end its work.
        ``between`` runs while they exit.
        """
        sandbox = self.sandbox
        if sandbox is not None and not sandbox.exited():
            ask(signal.SIGTERM)
            if not sandbox.wait(GRACE):
                sandbox.stop(signal.SIGKILL, 0)
        servers = [c for c in self.children if c is not sandbox]
        for child in reversed(servers):
            child.send(signal.SIGTERM if child.busy() else signal.SIGKILL)
        between()
        for child in reversed(servers):
            if not child.wait(5.0):
                child.stop(signal.SIGKILL, 0)

    def close(self) -> None:
        """Every child is reaped: their descriptors go."""
        for child in self.children:
            child.close()
        self.children = []


class Signals:
    """The signals the launcher caught for CMD, in order, and the pipe that wakes its poll."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.tty = os.isatty(0)  # a terminal's keys reach CMD's group without us
        self.wake = -1  # read end, polled: a byte per signal caught

    @contextlib.contextmanager
    def caught(self) -> Iterator[None]:
        """:data:`FORWARD` go to :attr:`pending` inside the block; the old handlers after it."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wake = signal.set_wakeup_fd(wake_w)
        old = {sig: signal.signal(sig, self._on_signal) for sig in FORWARD}
        self.wake = wake_r
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wake)
            os.close(wake_r)
            os.close(wake_w)
            self.wake = -1

    def _on_signal(self, sig: int, _frame: object) -> None:
        self.pending.append(sig)

    def relay(self, ask: Callable[[int], None], deadline: float | None) -> float | None:
        """Pass what is pending to CMD (``ask``); the deadline of its grace, once asked."""
        while self.pending:
            sig = self.pending.pop(0)
            if self.tty and sig in (signal.SIGINT, signal.SIGQUIT):
                # From the keyboard: the command (same foreground group) got
                # it too and decides; an interactive shell ignores it.
                continue
            ask(sig)
            if deadline is None:
                deadline = time.monotonic() + GRACE
        return deadline
