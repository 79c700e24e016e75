"""The parent of the agent's command inside a bwrap session: the go byte, then its signals.

bwrap runs this file with ``python3 -I -S`` (standard library only, no site,
no environment) as the first process of the sandbox.  (The proxy's ports
inside, 127.0.0.1:3128 and :1080, are the launcher's: :mod:`.bridge` opens
them in the sandbox's network namespace from the host.)  It:

0. under rlimits (no cgroup to hold the session), sets its own first:
   ``--rlimit RESOURCE=VALUE``, each as both soft and hard limit, read back; the
   command is its child and inherits them.  The launcher's prlimit walk of the
   waiting tree cannot promise that alone (a fork in flight keeps the old
   limits: :func:`libbroker.sandbox.cgroups.move_tree`); one that cannot be
   set ends the sandbox before go, so the command never runs without them;
1. waits for the launcher's go byte on ``--control FD`` (the launcher sends it
   once the proxy and broker listen: the sandbox is built while they start);
2. starts the command (posix_spawn), then relays signals: every later byte on the
   control pipe is a signal number for the command (its process group when it
   has one); end of file means the launcher is gone, so the command is killed;
3. exits with the command's status (128+N when signal N ended it).
"""

from __future__ import annotations

import os
import select
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal  # the C module: signal.py's enum wrappers cost more than this file

# Start-up is part of every session (this runs before the command): the C
# modules _signal and select stand in for signal and selectors (whose enum
# conversions cost more than the rest of this file); no contextlib (it alone
# costs ~6 ms here).

_DEFAULTS = (
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGCHLD,
)


USAGE = "usage: forwarder.py --control FD [--own-group] [--rlimit RESOURCE=VALUE]... -- CMD..."


class Options:
    """What the launcher asked for (:func:`parse`)."""

    def __init__(self) -> None:
        self.control = -1
        self.own_group = False
        self.rlimits: list[tuple[int, int]] = []
        self.cmd: list[str] = []


def parse(argv: list[str]) -> Options:
    """The options; ValueError naming the first one that is wrong."""
    opts = Options()
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--control" and i + 1 < len(argv):
            opts.control = int(argv[i + 1])
            i += 2
        elif argv[i] == "--rlimit" and i + 1 < len(argv):
            opts.rlimits.append(_rlimit(argv[i + 1]))
            i += 2
        elif argv[i] == "--own-group":
            opts.own_group = True
            i += 1
        else:
            raise ValueError(f"unexpected argument {argv[i]!r}")
    opts.cmd = argv[i + 1 :]
    if opts.control < 0 or not opts.cmd:
        raise ValueError(USAGE)
    return opts


def _rlimit(text: str) -> tuple[int, int]:
    which, eq, value = text.partition("=")
    if not (eq and which.isdigit() and value.isdigit()):
        raise ValueError(f"--rlimit {text!r}: expected RESOURCE=VALUE (two numbers)")
    return int(which), int(value)


def limit_self(rlimits: list[tuple[int, int]]) -> None:
    """Each rlimit as soft and hard, then read back; OSError naming the one that did not take.

    Lowering a limit needs no privilege; the command, started after, inherits them.
    (``resource`` only here: a session with cgroups starts without it.)
    """
    if not rlimits:
        return
    import resource

    for which, value in rlimits:
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError, OverflowError) as exc:
            raise OSError(f"cannot set the session's limit {which} to {value}: {exc}") from None
        if resource.getrlimit(which) != (value, value):
            raise OSError(f"the session's limit {which} reads back other than {value}")


def _spawn(cmd: list[str], own_group: bool) -> int:
    """Start the command: default signals, an empty mask, its own group only without a tty.

    posix_spawnp, not fork: no copy of this process (page tables, at-fork
    hooks) between the go byte and the command.  OSError if it cannot start.
    """
    if own_group:
        return os.posix_spawnp(
            cmd[0], cmd, os.environ, setsigdef=_DEFAULTS, setsigmask=(), setpgroup=0
        )
    return os.posix_spawnp(cmd[0], cmd, os.environ, setsigdef=_DEFAULTS, setsigmask=())


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def serve(control: int, own_group: bool, cmd: list[str]) -> int:
    """Wait for go, run ``cmd``, relay signals until it ends; its exit status."""
    if os.read(control, 1) != b"g":
        return 125  # the launcher gave up before the session started
    # bwrap hands the pipe over inheritable; the command must not get it (it could
    # read the signals meant for it, the grace's SIGKILL among them).
    os.set_inheritable(control, False)
    # The SIGCHLD wake-up: a pipe the handler's C side writes (set_wakeup_fd).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        child = _spawn(cmd, own_group)
    except FileNotFoundError:
        os.write(2, f"agent-sandbox: {cmd[0]}: command not found\n".encode())
        return 127
    except OSError as exc:
        os.write(2, f"agent-sandbox: {cmd[0]}: {exc.strerror}\n".encode())
        return 126
    poller = select.poll()
    for fd in (control, wake_r):
        poller.register(fd, select.POLLIN)
    while True:
        pid, st = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return _status(st)
        for fd, _ in poller.poll():
            if fd == wake_r:
                os.read(wake_r, 4096)
            elif fd == control:
                data = os.read(control, 64)
                sigs = list(data) if data else [signal.SIGKILL]
                for sig in sigs:
                    _signal(child, own_group, sig)
                if not data:
                    poller.unregister(control)


def _signal(child: int, own_group: bool, sig: int) -> None:
    try:
        if own_group:
            os.killpg(child, sig)
        else:
            os.kill(child, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
        limit_self(opts.rlimits)  # before go: a sandbox that cannot never runs the command
        return serve(opts.control, opts.own_group, opts.cmd)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"agent-sandbox: sandbox start: {exc}\n")
        return 125


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: exit as the command did
