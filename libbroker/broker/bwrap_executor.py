"""The bubblewrap backend for brokered commands: every command in fresh namespaces.

The command line comes from the one builder, :func:`libbroker.sandbox.bwrap.argv`,
over the command's :class:`~libbroker.sandbox.shape.Shape` (the profile's
paths, the workdir read-write, the command's cwd).  With ``--unshare-all`` the
command has its own network namespace: no network at all, or in proxy mode
just the proxy port, bridged in (see :mod:`libbroker.sandbox.bridge`).

The command runs as ``sh -c 'exec "$@"'`` so that "not found" and "not
executable" come back as 127 and 126 (bwrap itself reports both as 1).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping

from libbroker.broker.executor import Child, Executor, killpg_quietly
from libbroker.broker.profile import Profile, command_environment, command_shape
from libbroker.errors import SandboxUnavailable, SpawnError
from libbroker.sandbox import bwrap, cgroups, seccomp
from libbroker.sandbox.bwrap_backend import BwrapStart
from libbroker.sandbox.kinds import BWRAP

# sh exports PWD to what it execs: unset it, so the environment is exactly the policy's.
_EXEC_WRAPPER = ("/bin/sh", "-c", 'unset PWD; exec "$@"', "sh")


def bwrap_args(
    profile: Profile, workdir: str, cwd: str, info_fd: int | None = None,
    block_fd: int | None = None, seccomp_fd: int | None = None,
) -> list[str]:  # fmt: skip
    """The bwrap options (everything before ``--``) for one command.  Pure but for stat."""
    shape = command_shape(profile, workdir, cwd)
    facts = bwrap.shape_facts(shape)
    return bwrap.argv(shape, facts, info_fd=info_fd, block_fd=block_fd, seccomp_fd=seccomp_fd)


class BwrapExecutor(Executor):
    """Runs each command under a fresh bwrap."""

    name = BWRAP

    def __init__(self, profile: Profile, workdir: str, server_env: Mapping[str, str]) -> None:
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable(
                "bwrap backend: bubblewrap is not installed (apt install bubblewrap)"
            )
        self.bwrap = found
        self.profile = profile
        self.workdir = workdir
        self.env = command_environment(server_env, profile.env_allow, tmpdir="/tmp")
        shape = command_shape(profile, workdir, workdir)
        self.facts = bwrap.shape_facts(shape)  # the cwd is inside the workdir
        prog = seccomp.program()
        if prog is None:
            raise SandboxUnavailable(f"bwrap backend: no seccomp filter for {os.uname().machine}")
        self.seccomp = prog
        self._start_limits(profile.limits)
        self._probe()

    def _probe(self) -> None:
        """Fail at startup, not on the first command, when namespaces are not allowed."""
        try:
            sec = bwrap.seccomp_pipe(self.seccomp)
            try:
                done = subprocess.run(
                    [self.bwrap, *self._args(self.workdir, None, None, sec), "--", "true"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=10,
                    pass_fds=(sec,),
                    env=self.env,
                )
            finally:
                os.close(sec)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bwrap backend: cannot run bwrap: {exc}") from None
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").strip().splitlines()
            raise SandboxUnavailable(
                "bwrap backend: bwrap does not work here: " + (reason[-1] if reason else "?")
            )

    def describe(self) -> str:
        return f"bwrap ({self.bwrap})"

    def _args(self, cwd: str, info_fd: int | None, block_fd: int | None, sec_fd: int) -> list[str]:
        shape = command_shape(self.profile, self.workdir, cwd)
        return bwrap.argv(shape, self.facts, info_fd=info_fd, block_fd=block_fd, seccomp_fd=sec_fd)

    def spawn(self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int]) -> Child:
        try:
            group = self._new_group(self.profile.limits)
        except OSError as exc:
            raise SpawnError(f"cannot set the command's limits: {exc.strerror or exc}") from None
        try:
            return self._spawn(argv, cwd, stdio, group)
        except BaseException:
            cgroups.remove(group)
            raise

    def _spawn(
        self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int], group: cgroups.Group
    ) -> Child:
        try:
            start = BwrapStart(self.seccomp, held=self.profile.proxy_port is not None)
        except OSError as exc:
            raise SpawnError(f"cannot start bwrap: {exc.strerror}") from None
        block = start.go_fd if start.go_fd >= 0 else None
        try:
            # Popen, not posix_spawn: it restores SIGPIPE to default in the child.
            proc = subprocess.Popen(
                [self.bwrap, *self._args(cwd, start.info_w, block, start.seccomp_fd), "--",
                 *_EXEC_WRAPPER, *argv],
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                pass_fds=start.pass_fds,
                start_new_session=True,
                env=self.env,
                # bwrap itself joins the command's group (or takes its rlimits)
                # before it execs: everything it starts is born inside.
                preexec_fn=functools.partial(cgroups.join_self, group.entry()),
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            start.release()
            why = exc.strerror if isinstance(exc, OSError) else "cannot join its limits"
            raise SpawnError(f"cannot start bwrap: {why}") from None
        finally:
            start.spawned()
        proc.returncode = 0  # the server reaps it through a pidfd; silence Popen.__del__
        child = BwrapChild(proc.pid, start, group)
        if block is not None:
            self._connect_proxy(child)
        return child

    def _connect_proxy(self, child: BwrapChild) -> None:
        """Open the proxy port inside the new namespace, then let bwrap exec the command."""
        port = self.profile.proxy_port
        assert port is not None
        try:
            inner = child.start.wait_inner()
            if inner is None:
                raise SpawnError("bwrap failed before starting the command")
            child.start.listen(inner, (port,))
            child.start.go((port,), b"go")
        except BaseException:
            # Killed before the go pipe closes: bwrap must not run the command.
            child.kill()
            os.waitpid(child.pid, 0)
            child.release()
            raise


class BwrapChild(Child):
    """A bwrap process; the command's group is led by bwrap's pid-namespace init."""

    def __init__(self, pid: int, start: BwrapStart, group: cgroups.Group | None = None) -> None:
        self.pid = pid
        self.group = group
        self.start = start  # its info pipe, its go pipe and the proxy's bridge

    def send_signal(self, signum: int) -> None:
        # The sandbox's init ignores signals it has no handler for; the command
        # shares its process group (bwrap --new-session), so it gets them.
        inner = self.start.inner_now()
        killpg_quietly(inner if inner is not None else self.pid, signum)

    def kill(self) -> None:
        inner = self.start.inner_now()
        if inner is not None:
            killpg_quietly(inner, 9)
        killpg_quietly(self.pid, 9)  # --die-with-parent and the pid namespace do the rest

    def release(self) -> None:
        super().release()  # bwrap is gone; its pid namespace is going
        self.start.release()


EXECUTOR = BwrapExecutor
"""What :mod:`libbroker.broker.executor_choice` builds for this backend."""
