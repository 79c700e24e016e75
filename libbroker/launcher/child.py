"""The launcher's child processes: ``posix_spawn``, pipes and pidfds, nothing heavier.

Light on purpose (``os``, ``sys`` and C modules): ``agent-sandbox run``
spawns its servers with this before it imports anything else
(:mod:`.prestart`), and ``subprocess`` alone costs more than the spawns.

``posix_spawn`` runs no code of ours between fork and exec (glibc uses
``clone(CLONE_VM|CLONE_VFORK)``: no copy of the launcher's memory either), so:

- a child that must die with the launcher arranges it itself
  (:func:`.boot.die_with`; bwrap has ``--die-with-parent``);
- what ``subprocess`` does in the child is done here: every inherited
  descriptor but 0-2 and ``pass_fds`` is closed (``close_fds``), SIGPIPE and
  SIGXFSZ are back to their defaults (``restore_signals``), and the program is
  looked up on the PATH of the child's environment.

One difference remains, glibc's: its posix_spawn starts the child with its
two internal signals (32 and 33, SIGCANCEL and SIGSETXID) ignored, and an
ignored disposition survives exec, so the servers, the sandbox and what they
start inherit that.  Harmless: glibc and musl install their own handlers for
them when they need them, and nothing else uses these numbers.

:class:`Proc` is the part of ``subprocess.Popen`` the launcher uses;
:class:`Child` is one child the session owns (pidfd, stderr tail, signals).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import select

from libbroker.errors import LaunchError
from libbroker.which import which

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping, Sequence
else:
    import _signal as signal  # signal.py's enum conversions cost more than this module

_TAIL_LINES = 20


class Proc:
    """A spawned process: its pid, its pipes (unbuffered), its exit status once reaped.

    ``returncode`` follows ``subprocess``: the exit status, or ``-N`` when
    signal N ended it.
    """

    def __init__(
        self, pid: int, stdin: io.FileIO | None, stdout: io.FileIO | None, stderr: io.FileIO | None
    ) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the process has exited (reaping it), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0  # reaped elsewhere: as subprocess does
            else:
                if pid:
                    self._reaped(status)
        return self.returncode

    def wait(self) -> int:
        """Wait for the process to exit and reap it; its status."""
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.returncode = 0
            else:
                self._reaped(status)
        assert self.returncode is not None
        return self.returncode


def _find(program: str, env: Mapping[str, str] | None) -> str:
    """``program``'s path: as given when it has a slash, else from the child's PATH."""
    if "/" in program:
        return program
    path = which(program, env)
    if path is None:
        raise FileNotFoundError(2, "No such file or directory", program)
    return path


def _close_actions(keep: set[int]) -> list[tuple[int | str, ...]]:
    """Close every inheritable descriptor above 2 not in ``keep`` (subprocess's close_fds)."""
    actions: list[tuple[int | str, ...]] = []
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every possible descriptor, as subprocess would
        fds = list(range(3, min(os.sysconf("SC_OPEN_MAX"), 1 << 16)))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                continue  # not open (listdir's own descriptor, closed by now)
    return actions


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: str = "inherit",
    output: str = "inherit",
    stderr: str = "",
    pass_fds: Sequence[int] = (),
    ignore: Sequence[int] = (),
    setpgroup: bool = False,
) -> Proc:
    """Spawn ``argv``; OSError if it cannot start.

    ``stdin``: "inherit", "devnull" or "pipe" (:attr:`Proc.stdin`, the write
    end).  ``output`` (stdout and stderr): "inherit", "devnull" or "pipe"
    (:attr:`Proc.stdout`, :attr:`Proc.stderr`, the read ends); ``stderr``
    when it differs.  ``ignore``:
    signals the child starts with ignored (an ignored disposition survives
    exec; a handler does not).  ``setpgroup``: its own process group.
    """
    argv = list(argv)
    program = _find(argv[0], env)
    actions: list[tuple[int | str, ...]] = []
    ours: list[int] = []  # the child's ends, closed here once it runs
    mine: dict[str, int] = {}  # our ends
    try:
        _stdio(actions, ours, mine, stdin, output, stderr or output)
        keep = set(pass_fds)
        actions += _close_actions(keep)
        pid = _spawn(program, argv, env, actions, keep, ignore, setpgroup)
    except BaseException:
        for fd in mine.values():
            os.close(fd)
        raise
    finally:
        for fd in ours:
            os.close(fd)

    def stream(name: str, mode: str) -> io.FileIO | None:
        fd = mine.get(name)
        return None if fd is None else io.FileIO(fd, mode)

    return Proc(pid, stream("stdin", "wb"), stream("stdout", "rb"), stream("stderr", "rb"))


def _stdio(actions: list[tuple[int | str, ...]], ours: list[int], mine: dict[str, int],
           stdin: str, stdout: str, stderr: str) -> None:
    """The file actions for the child's stdio; pipes' ends to ``ours`` (the child's) and
    ``mine`` (by name), so the caller closes them on every path."""
    if stdin == "pipe":
        r, w = os.pipe()
        ours.append(r)
        mine["stdin"] = w
        actions.append((os.POSIX_SPAWN_DUP2, r, 0))
    elif stdin == "devnull":
        actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
    for name, target, mode in (("stdout", 1, stdout), ("stderr", 2, stderr)):
        if mode == "pipe":
            r, w = os.pipe()
            ours.append(w)
            mine[name] = r
            actions.append((os.POSIX_SPAWN_DUP2, w, target))
        elif mode == "devnull":
            actions.append((os.POSIX_SPAWN_OPEN, target, os.devnull, os.O_WRONLY, 0))


def _spawn(program: str, argv: list[str], env: Mapping[str, str] | None,
           actions: list[tuple[int | str, ...]], keep: set[int], ignore: Sequence[int],
           setpgroup: bool) -> int:
    """posix_spawn with ``keep`` inheritable and ``ignore`` ignored for that moment only."""
    made = [fd for fd in keep if not os.get_inheritable(fd)]
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignore}
    try:
        for fd in made:
            os.set_inheritable(fd, True)
        environ = os.environ if env is None else env
        dfl = (signal.SIGPIPE, signal.SIGXFSZ)
        if setpgroup:
            return os.posix_spawn(
                program, argv, environ, file_actions=actions, setsigdef=dfl, setpgroup=0
            )
        return os.posix_spawn(program, argv, environ, file_actions=actions, setsigdef=dfl)
    finally:
        for fd in made:
            os.set_inheritable(fd, False)
        for sig, old in saved.items():
            signal.signal(sig, old)


class Child:
    """One child process the launcher owns."""

    def __init__(self, name: str, proc: Proc, pidfd: int) -> None:
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
        """Write a deferred boot's arguments (:func:`.boot.encode_args`), close its stdin.

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
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    pipes: bool = True,
    stdin_pipe: bool = False,
    ignore: Sequence[int] = (),
) -> Child:
    """Start ``argv`` as a child named ``name``; stdout and stderr piped when ``pipes``.

    stdin is a pipe with ``stdin_pipe`` (:meth:`Child.send_args`), else
    /dev/null with ``pipes``, else inherited.  The child gets no signal when
    the launcher dies unless ``argv`` arranges it (:func:`.boot.die_with`).
    """
    try:
        proc = start(
            argv,
            env=env,
            stdin="pipe" if stdin_pipe else "devnull" if pipes else "inherit",
            output="pipe" if pipes else "inherit",
            pass_fds=pass_fds,
            ignore=ignore,
        )
    except OSError as exc:
        raise LaunchError(f"cannot start {name}: {exc.strerror}: {argv[0]}") from None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError as exc:  # out of descriptors: end it rather than own it blind
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        raise LaunchError(f"cannot watch {name}: {exc.strerror}") from None
    return Child(name=name, proc=proc, pidfd=pidfd)
