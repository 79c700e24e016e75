"""The resident service's launcher zygote: ``agent-sandbox run`` forked warm (docs/serve.md).

A launcher spends 100-150 ms of CPU on its interpreter, imports and config
before its session starts.  This process pays the interpreter and the imports
once: it imports what ``run`` imports, holds no session's data, and waits.
For each warm run (:mod:`.warm_client`) it forks one child, which becomes
that ``agent-sandbox run`` as if it had been started cold by the client:

- the client's argv and environment (replaced, not merged);
- its working directory by the descriptor it passed (``fchdir``), its umask,
  rlimits, nice value and signal dispositions and mask;
- its stdin, stdout and stderr (passed descriptors, ``dup2``'d);
- its own session (``setsid``): no process group of the service's;
- no descriptor of the service or the zygote: only 0-2 and the client's
  connection (close-on-exec), on which it reads ``go`` and whose end of file
  (the client gone, even by SIGKILL) it gets as SIGHUP (``O_ASYNC``,
  ``F_SETSIG``): it ends its session as a launcher does on a hangup.

What the child cannot reproduce (other groups, a lower nice value, a raised
limit, another installation of the code) is refused before it starts: the
client then runs cold.  The zygote reaps each child and writes its wait
status to the client, which exits with it.

The service sends one ``SOCK_SEQPACKET`` message per run: the checked request
(:mod:`.warm_request`) with five descriptors (the four of the request, then
the client's connection); the zygote answers the client on that connection
(``{"ok": true, "pid": N}`` with a pidfd of the child, made by its parent),
and the service with ``{"pid": N}`` or ``{"error": ...}``.  One thread, so the
fork takes no lock half-held.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys

from libbroker.launcher import warm_request, zygote_code
from libbroker.sandbox.exec import keep_only

# What ``agent-sandbox run`` imports on its way to the session (its face and the
# session's modules); the rest it imports as it goes.
LAUNCHER_FACE = "bin.agent_sandbox"  # agent-sandbox's console script's module
LAUNCHER_WARM = (
    LAUNCHER_FACE,
    "libbroker.launcher.prestart",
    "libbroker.launcher.cli_checks",
    "libbroker.launcher.config_file",
    "libbroker.launcher.session",
    "libbroker.launcher.session_box",
    "libbroker.launcher.gitfacts",
    "libbroker.launcher.janitor",
    "libbroker.launcher.lazy_broker",
    "libbroker.launcher.record",
    "libbroker.launcher.report",
    "libbroker.launcher.hostrun_scan",
    "libbroker.launcher.hostrun_live",
    "libbroker.launcher.hostrun_sweep",
    "libbroker.launcher.agent_session",
    "libbroker.launcher.agent_copy",
    "libbroker.launcher.agent_home",
    "libbroker.launcher.agent_settings",
    "libbroker.launcher.exported_keys",  # an agent's session: its profile's steps
    "libbroker.launcher.key_notice",
    "libbroker.launcher.logins",
    "libpolicy.render",
    "libbroker.launcher.session_service",
    "libbroker.launcher.fanotify",
    "libbroker.launcher.hostrun_bindrecord",
    "libbroker.launcher.hostrun_binds",
    "libbroker.launcher.hostrun_gate",
    "libbroker.launcher.hostrun_judge",
    "libbroker.launcher.hostrun_renamed",
    "libbroker.launcher.refusals",
    "libbroker.native.start_script",
    "libbroker.sandbox.bwrap_backend",
    "libbroker.sandbox.landlock_backend",
    "libbroker.sandbox.landlock_helper",  # forked, not spawned, by a warm run
    "libbroker.sandbox.bridge",
    "libbroker.sandbox.cgroups",
    "libbroker.sandbox.holdlink",
    "libbroker.sandbox.reaper",
    "libbroker.sandbox.seccomp",
    "libpolicy.hostrun_gate_service",
    "libpolicy.hostrun_live",
    "libpolicy.model",
    "base64",
    "ctypes",
    "datetime",
    "encodings.idna",
    "hashlib",
    "resource",
    "shlex",
    "threading",
    "tomllib",
)
# What every Python program ignores from its start (the client cannot tell
# whether its parent ignored them too).
PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
_F_SETSIG = getattr(__import__("fcntl"), "F_SETSIG", 10)
_F_SETOWN = 8


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"agent-sandbox serve: launcher zygote: {line}\n".encode(errors="replace"))


def _warm() -> None:
    for name in LAUNCHER_WARM:
        with contextlib.suppress(ImportError):
            __import__(name)


def refusal(request: dict[str, object]) -> str:
    """Why the zygote cannot run ``request`` as the client would run it ("" when it can)."""
    if request["install"] != warm_request.install():
        return "another installation of agent-sandbox"
    if request["ids"] != warm_request.ids():
        return "the run's user or groups are not the service's"
    own = warm_request.privs()
    if request["privs"] != own or "?" in own:
        return ("the run's privileges are not the service's (no_new_privs, seccomp or "
                "capabilities)")
    return ""


def _settle(request: dict[str, object], fds: list[int]) -> None:
    """In the child: take the client's process settings; OSError when one cannot be taken."""
    import resource

    for res, soft, hard in request["rlimits"]:  # type: ignore[attr-defined]
        if resource.getrlimit(res) != (soft, hard):
            resource.setrlimit(res, (soft, hard))
    nice = request["nice"]
    assert isinstance(nice, int)
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    os.fchdir(fds[3])
    umask = request["umask"]
    assert isinstance(umask, int)
    os.umask(umask)
    signals = request["signals"]
    assert isinstance(signals, dict)
    for sig in range(1, signal.NSIG):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler: signal.Handlers | object = signal.SIG_DFL
        if sig in signals["ignored"] or sig in PYTHON_IGNORES:
            handler = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler  # what Python's start installs
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)  # type: ignore[arg-type]
    signal.pthread_sigmask(signal.SIG_SETMASK, signals["blocked"])


def _child(request: dict[str, object], fds: list[int], ready: int) -> None:
    """In the forked child: become the client's ``agent-sandbox run``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()
        _settle(request, fds)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)  # dup2 makes them inheritable, as a process's 0-2 are
        conn = os.dup(fds[4])  # not inheritable: no command of the session gets it
        os.set_blocking(conn, True)
        keep_only((0, 1, 2, conn, ready))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        os.write(ready, b"ok")
        os.close(ready)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.write(ready, (exc.strerror if isinstance(exc, OSError) and exc.strerror
                             else type(exc).__name__).encode())
        os._exit(1)
    try:
        _await_go(conn)
        from libbroker.launcher import trace

        trace.restart()
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = ["agent-sandbox", *argv]

        def report(code: int) -> None:  # the run's own code, should the zygote be gone
            with contextlib.suppress(OSError):
                os.write(conn, json.dumps({"exit": code}).encode() + b"\n")

        # The face by name, as its console script runs it (and as the broker
        # zygote runs broker-server's): its cold path, never the warm one again.
        importlib.import_module(LAUNCHER_FACE).cold_main(report)  # os._exit()s
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # a child never returns into the zygote's loop
        code = 1
    os._exit(code)


def _await_go(conn: int) -> None:
    """Wait for the client's ``go``; then its end of file (the client gone) is our SIGHUP."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(conn, 16)
        if not chunk or len(data) > 16:
            os._exit(0)  # the client gave up before it knew we started: nothing ran
        data += chunk
    if data != b"go\n":
        os._exit(0)
    import fcntl

    fcntl.fcntl(conn, _F_SETOWN, os.getpid())
    fcntl.fcntl(conn, _F_SETSIG, signal.SIGHUP)
    fcntl.fcntl(conn, fcntl.F_SETFL, fcntl.fcntl(conn, fcntl.F_GETFL) | os.O_ASYNC)
    if select.select([conn], [], [], 0)[0]:  # gone before O_ASYNC was armed
        os.kill(os.getpid(), signal.SIGHUP)


class Zygote:
    """The loop: requests from the service, children reaped, statuses to their clients."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.runs: dict[int, int] = {}  # child pid -> its client's connection
        self.sources = zygote_code.sources()  # the code as it was imported

    def launch(self, request: dict[str, object], fds: list[int]) -> dict[str, object]:
        """Fork the run; the client's answer sent; the service's returned."""
        why = refusal(request)
        if why:
            raise ValueError(why)
        stale = zygote_code.stale_refusal(self.sources)
        if stale:
            raise ValueError(stale)
        ready_r, ready_w = os.pipe()
        try:
            pid = os.fork()
            if pid == 0:
                self.sock.close()
                os.close(ready_r)
                _child(request, fds, ready_w)
            os.close(ready_w)
            ready_w = -1
            said = os.read(ready_r, 256)
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        if said != b"ok":  # it has exited (reaped with the others): nothing ran
            raise ValueError(f"the run's settings cannot be taken here: "
                             f"{said.decode(errors='replace') or 'the child exited'}")
        self.runs[pid] = os.dup(fds[4])
        pidfd = os.pidfd_open(pid)
        try:
            with socket.socket(fileno=os.dup(fds[4])) as conn:
                socket.send_fds(conn, [json.dumps({"ok": True, "pid": pid}).encode() + b"\n"],
                                [pidfd])
        finally:
            os.close(pidfd)
        return {"pid": pid}

    def reap(self) -> None:
        """Each ended child's wait status to its client (who exits with it)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.runs.pop(pid, -1)
            if conn >= 0:
                with contextlib.suppress(OSError):
                    os.write(conn, json.dumps({"status": status}).encode() + b"\n")
                os.close(conn)

    def request(self) -> bool:
        """One request from the service; False when the service is gone."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, warm_request.MAX_REQUEST + 1024, 5)
        except OSError:
            return False
        if not data:
            return False
        try:
            request = warm_request.check(json.loads(data))
            if len(fds) != 5:
                raise ValueError("five descriptors expected")
            answer = self.launch(request, fds)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            _say(f"refused a run: {why}")
            answer = {"error": why}
            if len(fds) == 5:
                with contextlib.suppress(OSError):
                    os.write(fds[4], json.dumps({"ok": False, "error": why}).encode() + b"\n")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            self.sock.send(json.dumps(answer).encode())
        except OSError:
            return False
        return True


def serve(sock: socket.socket) -> int:
    """Fork one run per request until the service closes the socket."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # the wakeup pipe says it
    zygote = Zygote(sock)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                with contextlib.suppress(OSError):
                    os.read(wake_r, 4096)
                zygote.reap()
            elif not zygote.request():
                return 0


def main() -> int:
    return zygote_code.main(_warm, serve)


if __name__ == "__main__":
    sys.exit(main())
