"""The Landlock helper forked from the launcher, not spawned as a new interpreter.

A spawn pays a fresh interpreter's start and the helper's imports (~40 ms of
CPU) while the launcher and the servers start on the same cores.  So when this
process runs one thread (a fork takes no lock half-held: the session's start,
before its first thread, :meth:`.session_box.Box.begin`), the helper is a fork
of the launcher, whose imports are done by then (most of the helper's too,
shared rather than imported again), that becomes
:func:`libbroker.sandbox.landlock_helper.main` and nothing else, as the
spawned one would:

- only 0-2 and its two pipes stay open (a spawn's ``close_fds``): no
  descriptor of the launcher's reaches the helper, nor through it the command;
- its environment is ``PATH`` alone, as the spawn's (the command's own comes
  in its spec);
- every signal a Python handler of the launcher's catches is back to its
  default (SIGINT to Python's), the wake-up descriptor dropped, so no launcher
  code runs in it; SIGPIPE and SIGXFSZ to their defaults, as the spawn does;
- it never returns into the launcher's code: ``os._exit`` on every path.

Its ``/proc`` entry shows the launcher's command line and first environment,
and its memory is a copy of the launcher's at the session's start (its config),
all of which the launcher's own shows too: nothing new to a process of the same
user, and nothing to the command (its own PID namespace, else Landlock's ptrace
scoping, keeps both out of its reach).  Later, with threads running (a helper
not forked at the start), it is spawned.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from libbroker.errors import LaunchError
from libbroker.launcher.child import Child, Proc

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal



def can_fork() -> bool:
    """Nothing but this thread runs."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def fork(fds: tuple[int, int], path: str) -> Child:
    """The helper, forked; ``fds`` are its pipes' read ends (spec, life).  LaunchError."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()  # nothing of ours written twice by the child
    try:
        pid = os.fork()
    except OSError as exc:
        raise LaunchError(f"cannot start sandbox: {exc.strerror}") from None
    if pid == 0:
        _become_helper(fds, path)  # never returns
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:  # out of descriptors: end it rather than own it blind
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise LaunchError(f"cannot watch sandbox: {exc.strerror}") from None
    return Child(name="sandbox", proc=Proc(pid, None, None, None), pidfd=pidfd)


def _become_helper(fds: tuple[int, int], path: str) -> None:
    code = 125
    try:
        signal.set_wakeup_fd(-1)
        # The launcher's start runs without the cyclic collector (bin/agent_sandbox.main);
        # the helper reaps for the session's length: on, the launcher's objects frozen.
        gc.freeze()
        gc.enable()
        for sig in range(1, signal.NSIG):
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        from libbroker.sandbox.exec import keep_only  # in the child: not on prestart's path

        keep_only((0, 1, 2, *fds))
        os.environ.clear()
        os.environ["PATH"] = path
        from libbroker.sandbox import landlock_helper

        code = landlock_helper.main([str(fd) for fd in fds])
        sys.stderr.flush()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"agent-sandbox: cannot start the Landlock sandbox: {exc!r}\n".encode())
    finally:  # whatever was raised, the launcher's code never resumes here
        os._exit(code)

