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
  launcher does that itself and dismisses the janitor.
"""

from __future__ import annotations

import contextlib
import os

from libbroker.errors import LaunchError
from libbroker.launcher import boot
from libbroker.launcher.child import Child as Child
from libbroker.launcher.child import spawn as spawn
from libbroker.launcher.child import start


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
