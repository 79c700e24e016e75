"""The bwrap backend: whether bwrap can run here, what it makes of a Shape, and its start.

Both of its callers, broker-server's executor for each brokered command
(:mod:`libbroker.broker.bwrap_executor`) and the session's box
(:mod:`libbroker.launcher.session_box`), start bwrap through a
:class:`BwrapStart`; each brings its own argv around :func:`.bwrap.argv` and
its own way to spawn (the broker's ``Popen``, the session's supervised child).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from libbroker.sandbox.backend import FAIL, OK, Backend, Finding
from libbroker.sandbox.bwrap import info_pid, read_info, seccomp_pipe
from libbroker.sandbox.kinds import BWRAP, LANDLOCK
from libbroker.which import which

if TYPE_CHECKING:
    import _socket

    from libbroker.sandbox.bridge import Bridge

_ALTERNATIVE = f"or use --sandbox={LANDLOCK}"
_TRY = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"]


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


class BwrapBackend(Backend):
    """bubblewrap: every namespace unshared, the shape's paths bound (:func:`.bwrap.argv`)."""

    name = BWRAP
    executor = "libbroker.broker.bwrap_executor"

    def unavailable(self) -> str | None:
        if which("bwrap"):
            return None
        return f"bwrap is not installed (apt-get install bubblewrap), {_ALTERNATIVE}"

    def diagnose(self) -> Finding:
        if not which("bwrap"):
            return Finding(FAIL, "bwrap: not installed",
                           f"`apt-get install bubblewrap`, {_ALTERNATIVE}", "sandbox", "bwrap")
        import subprocess  # doctor's probe only: not on a session's start (~5 ms of imports)

        try:
            done = subprocess.run(_TRY, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            code, err = 127, str(exc)
        else:
            code, err = done.returncode, (done.stderr or done.stdout).strip()
        if code == 0:
            return Finding(OK, "bwrap: user, network and pid namespaces work", group="sandbox",
                           short="bwrap")
        return Finding(FAIL, *_why_not(err))


def _why_not(err: str) -> tuple[str, str]:
    """What stops bwrap here, and the fix."""
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            f"bwrap: cannot create namespaces ({err}); "
            "Ubuntu's AppArmor restricts unprivileged user namespaces",
            "add an AppArmor profile for /usr/bin/bwrap allowing userns "
            f"(see /etc/apparmor.d/bwrap-userns-restrict), {_ALTERNATIVE}",
        )
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return ("bwrap: user namespaces are disabled",
                f"`sysctl -w user.max_user_namespaces=15000` (as root), {_ALTERNATIVE}")
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("bwrap: unprivileged user namespaces are off",
                f"`sysctl -w kernel.unprivileged_userns_clone=1` (as root), {_ALTERNATIVE}")
    return (f"bwrap: does not run ({err})",
            "run `bwrap --unshare-all --die-with-parent --ro-bind / / true` to see why, "
            + _ALTERNATIVE)


class BwrapStart:
    """One bwrap sandbox's start, its ports and its end: what the broker's executor and the
    session's box share around the argv each builds with :func:`.bwrap.argv`.

    It makes the pipes bwrap is given (:attr:`pass_fds`): the seccomp filter's,
    ``--info-fd`` (the sandbox's pid, once its namespaces exist) and, when
    ``held``, a go pipe whose read end (:attr:`go_fd`) holds the command back
    (bwrap's ``--block-fd``, or the session forwarder's control) until
    :meth:`go` writes on it.  Meanwhile the proxy's ports are opened inside the
    sandbox's network namespace (:meth:`listen`) and bridged to the host's at
    :meth:`go`.  :meth:`release` closes everything it holds, on every path.
    A :class:`~.backend.Started`.
    """

    def __init__(self, prog: bytes, *, held: bool) -> None:
        self.seccomp_fd = seccomp_pipe(prog)
        self.info_fd = self._info_w = self.go_fd = self._go_w = -1
        self.inner: int | None = None  # the sandbox's init, as the host sees it
        self.listeners: list[_socket.socket] = []  # the proxy's ports inside, until go
        self.bridges: list[Bridge] = []
        try:
            self.info_fd, self._info_w = os.pipe2(os.O_CLOEXEC)
            if held:
                self.go_fd, self._go_w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            self.release()
            raise

    @property
    def info_w(self) -> int:
        """The write end bwrap's ``--info-fd`` names."""
        return self._info_w

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The fds bwrap is given (closed here by :meth:`spawned`)."""
        held = (self.go_fd,) if self.go_fd >= 0 else ()
        return (self._info_w, self.seccomp_fd, *held)

    def spawned(self) -> None:
        """bwrap has its ends (or failed to start): ours of them are closed."""
        for name in ("_info_w", "seccomp_fd", "go_fd"):
            _close(self, name)

    def wait_inner(self) -> int | None:
        """The sandbox's pid, waiting for bwrap to tell it; None if bwrap ended first."""
        if self.inner is None and self.info_fd >= 0:
            self.inner = read_info(self.info_fd)
        return self.inner

    def inner_now(self) -> int | None:
        """The sandbox's pid if bwrap has told it already (read once, never waiting)."""
        if self.inner is None and self.info_fd >= 0:
            os.set_blocking(self.info_fd, False)
            try:
                data = os.read(self.info_fd, 4096)
            except BlockingIOError:
                return None
            self.inner = info_pid(data)
        return self.inner

    def listen(self, inner: int, ports: tuple[int, ...]) -> None:
        """``ports`` opened in the network namespace of ``inner`` (SpawnError if not)."""
        from libbroker.sandbox.bridge import listen_in_netns

        self.listeners = listen_in_netns(inner, ports)

    def go(self, targets: tuple[int, ...], word: bytes, *, keep: bool = False) -> None:
        """``word`` lets the command run, then each port inside is bridged to its host port
        in ``targets``; the go pipe stays open for :meth:`signal` when ``keep``.

        The bridges after the word: each starts a thread, whose start waits for a core
        and the GIL (1-6 ms on two busy cores), and the ports inside listen already, so a
        connection the command makes first waits in the backlog until its bridge accepts.
        """
        from libbroker.sandbox.bridge import Bridge

        if len(self.listeners) != len(targets):
            raise ValueError(f"{len(targets)} targets for {len(self.listeners)} ports")
        os.write(self._go_w, word)
        if not keep:
            _close(self, "_go_w")
        for port in targets:  # each listener a bridge's, or closed by release() on a failure
            self.bridges.append(Bridge(self.listeners[0], port))
            self.listeners.pop(0)

    def signal(self, sig: int) -> bool:
        """A signal number for the command on the go pipe, which the session's forwarder
        reads after the go byte; False when that pipe is closed (nothing was sent)."""
        if self._go_w < 0:
            return False
        with contextlib.suppress(OSError):  # gone (EPIPE): nothing to deliver it to
            os.write(self._go_w, bytes([sig]))
        return True

    def stop(self) -> None:
        """The bridges stop accepting (the sandbox is gone: its connections end too)."""
        for bridge in self.bridges:
            bridge.close()

    def release(self) -> None:
        """Everything it holds closed; idempotent."""
        self.stop()
        self.bridges = []
        for sock in self.listeners:  # a start that ended before go
            sock.close()
        self.listeners = []
        self.spawned()
        _close(self, "info_fd")
        _close(self, "_go_w")


def _close(owner: BwrapStart, name: str) -> None:
    fd: int = getattr(owner, name)
    if fd >= 0:
        setattr(owner, name, -1)
        os.close(fd)
