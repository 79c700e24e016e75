"""The launcher's children: start, wait for ``listening``, stop in order, reap.

Ownership rules (trio's, with processes):

- every child is started by the main thread with ``PR_SET_PDEATHSIG``, so the
  kernel signals it if the launcher dies, even by SIGKILL (bwrap gets
  ``--die-with-parent`` instead, which is the same thing);
- every child gets a pidfd, so waits are exact (poll, no sleep loops) and a
  signal can never reach a recycled pid;
- the :class:`Janitor`, a small process that only waits on a pipe,
  finishes the job when the launcher is killed: it ends what is left of
  the session and removes the runtime directory.  On every other path the
  launcher does that itself and dismisses the janitor.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Callable, Sequence

from libbroker.errors import LaunchError

_PR_SET_PDEATHSIG = 1
_TAIL_LINES = 20


def _pdeathsig(sig: int) -> Callable[[], None]:
    """A preexec_fn: die with ``sig`` when the launcher dies (the race included)."""
    import ctypes  # only the launcher pays for it, once

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


class Child:
    """One child process the launcher owns."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], pidfd: int) -> None:
        self.name = name
        self.proc = proc
        self.pidfd = pidfd
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.own_group = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def send(self, sig: int) -> None:
        """Signal the child (its group when it leads one); a no-op once it is gone."""
        if self.proc.returncode is not None:
            return
        try:
            if self.own_group:
                os.killpg(self.pid, sig)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, sig)

    def send_args(self, data: bytes) -> None:
        """Write a deferred boot's arguments (:func:`plan.encode_args`), close its stdin.

        A child that is already gone is not an error here: its pidfd reports it.
        """
        stdin = self.proc.stdin
        if stdin is None:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(stdin.fileno(), view) :]
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def busy(self) -> bool:
        """Whether the child has children of its own (work in flight)."""
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return False
        for task in tasks:
            try:
                with open(f"/proc/{self.pid}/task/{task}/children") as fh:
                    if fh.read().strip():
                        return True
            except OSError:
                continue
        return False

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the child to exit; reap it if so."""
        if self.proc.returncode is None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            if not poller.poll(max(0, int(timeout * 1000))):
                return False
        self.proc.wait()
        return True

    def stop(self, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        """``sig``, ``grace`` seconds, then SIGKILL: it is gone when this returns."""
        self.send(sig)
        if not self.wait(grace):
            self.send(signal.SIGKILL)
            self.wait(60)

    def close(self) -> None:
        for f in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            if f is not None:
                f.close()
        os.close(self.pidfd)

    def error_tail(self) -> str:
        text = "\n".join(f"  {line}" for line in self.tail if line.strip())
        return f"; its stderr said:\n{text}" if text else ""


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    pdeathsig: int | None = signal.SIGTERM,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    pipes: bool = True,
    stdin_pipe: bool = False,
    ignore: Sequence[int] = (),
) -> Child:
    """Start ``argv`` as a child named ``name``; stdout and stderr piped when ``pipes``.

    ``stdin_pipe`` gives it a pipe as stdin (for :meth:`Child.send_args`).

    ``ignore`` lists signals the child starts with ignored (an ignored
    disposition survives exec; a handler does not).
    """
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignore}
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL if pipes else None,
            stdout=subprocess.PIPE if pipes else None,
            stderr=subprocess.PIPE if pipes else None,
            env=env,
            pass_fds=tuple(pass_fds),
            preexec_fn=_pdeathsig(pdeathsig) if pdeathsig else None,
        )
    except OSError as exc:
        raise LaunchError(f"cannot start {name}: {exc.strerror}: {argv[0]}") from None
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
    return Child(name=name, proc=proc, pidfd=os.pidfd_open(proc.pid))


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

        from libbroker.launcher import plan

        r, w = os.pipe()
        module = "libbroker.launcher.janitor"
        slow = [os.path.realpath(sys.executable), "-I", "-m", module]
        argv = [*plan.python_argv("agent-sandbox-janitor", module, slow), str(r), runtime_dir]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(r,),
                process_group=0,  # out of the terminal's foreground group: no tty signals
            )
        except OSError as exc:
            os.close(w)
            raise LaunchError(f"cannot start the session's janitor: {exc.strerror}") from None
        finally:
            os.close(r)
        self._w = w

    def watch(self, child: Child) -> None:
        os.write(self._w, f"{child.pid} {int(child.own_group)}\n".encode())

    def dismiss(self) -> None:
        """The launcher cleaned up itself: let the janitor go and reap it."""
        with contextlib.suppress(OSError):
            os.write(self._w, b"done\n")
        os.close(self._w)
        self._proc.wait()
