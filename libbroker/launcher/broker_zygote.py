"""The resident service's broker zygote: one warm interpreter, one fresh fork per session.

A broker-server's start is mostly its interpreter and imports (80-130 ms of
CPU).  The zygote pays that once: it imports what a broker needs and then
waits.  For each session it forks one child, which becomes that session's
broker-server and nothing else (docs/serve.md): the session's own pipes as its
stdin, stdout and stderr (made by the launcher, passed over the service's socket
with ``SCM_RIGHTS``), the launcher's environment, working directory and umask,
and its arguments on stdin as in the deferred boot (:mod:`.boot`).  A child
serves exactly one session and exits with it; nothing is shared between two
brokers but the read-only state of an interpreter that has seen no session.

What the zygote holds is what makes the fork safe: no session's data, no
descriptor but its socket to the service (a child closes every other), one
thread.  Its children it reaps as they end (a ``SIGCHLD`` handler); a child
puts ``SIGCHLD`` back first thing, so the broker's own waits work.
Each child gets ``SIGKILL`` when the zygote dies (``PR_SET_PDEATHSIG``), and the
zygote when the service dies, so a dead service leaves no broker behind; the
launcher, which holds a pidfd of its broker, sees it go and ends the session.

The service sends one ``SOCK_SEQPACKET`` message per session: JSON
``{"env": {...}, "cwd": DIR, "umask": N, "socket_fd": N}`` with four descriptors
(stdin, stdout, stderr, the broker's listening socket); the reply is
``{"pid": N}`` with a pidfd of the child (made by its parent: never a recycled pid).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys

from libbroker.launcher import zygote_code
from libbroker.launcher.prestart import BROKER_WARM
from libbroker.sandbox import backends
from libbroker.sandbox.exec import keep_only

MAX_REQUEST = 1 << 20
BROKER_FACE = "bin.broker_server"  # broker-server's console script's module
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(1)


def _warm() -> None:
    for name in (*BROKER_WARM, *(b.executor for b in backends.each()), BROKER_FACE, "ctypes"):
        with contextlib.suppress(ImportError):
            __import__(name)


def _broker(request: dict[str, object], fds: list[int], zygote: int) -> None:
    """In the forked child: become the session's broker-server; never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _die_with_parent(zygote)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        # The listening socket at the number the broker's --socket-fd names (the
        # launcher's own number for it); every other descriptor closed.
        keep = request.get("socket_fd")
        if not isinstance(keep, int) or keep < 3:
            os._exit(1)
        if fds[3] != keep:
            os.dup2(fds[3], keep)
        keep_only((0, 1, 2, keep))
        env = request.get("env")
        cwd = request.get("cwd")
        umask = request.get("umask")
        if isinstance(env, dict):
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        os.environ["AGENT_SANDBOX"] = "1"  # brokered commands are part of the session
        if isinstance(cwd, str):
            os.chdir(cwd)
        if isinstance(umask, int):
            os.umask(umask)
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(0, 65536)
            if not chunk:
                os._exit(0)  # the launcher gave up before the arguments
            data += chunk
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.argv = ["broker-server", *(os.fsdecode(a) for a in data[:-1].split(b"\0")[:-1])]
        # The face by name, as the launcher's own spawn runs it (boot.py): the
        # zygote runs broker-server's console entry, it does not call into it.
        importlib.import_module(BROKER_FACE).main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # a child never returns into the zygote's loop
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _reap(_sig: int, _frame: object) -> None:
    """Reap every broker that has ended (its CPU time counts as the zygote's children's)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(sock: socket.socket) -> int:
    """Fork one broker per request until the service closes the socket."""
    signal.signal(signal.SIGCHLD, _reap)
    me = os.getpid()
    imported = zygote_code.sources()  # the code as it was imported
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 4)
        except OSError:
            return 1
        if not data:
            return 0
        try:
            request = json.loads(data)
            if len(fds) != 4 or not isinstance(request, dict):
                raise ValueError("four descriptors and a JSON object expected")
            stale = zygote_code.stale_refusal(imported)
            if stale:  # the launcher spawns a broker of its own, of the new code
                raise ValueError(stale)
            pid = os.fork()
            if pid == 0:
                sock.close()
                _broker(request, fds, me)
            pidfd = os.pidfd_open(pid)
            try:
                socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
            finally:
                os.close(pidfd)
        except (OSError, ValueError) as exc:
            try:
                sock.send(json.dumps({"error": str(exc)}).encode())
            except OSError:
                return 1
        finally:
            for fd in fds:
                os.close(fd)


def main() -> int:
    return zygote_code.main(_warm, serve)


if __name__ == "__main__":
    sys.exit(main())
