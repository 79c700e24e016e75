"""The Landlock backend for brokered commands: a fresh ruleset per command.

For each command the server forks itself: the child (one thread, a copy of
a warm interpreter) runs the one hardening sequence
(:func:`libbroker.sandbox.enter.enter`: capabilities dropped, no_new_privs,
the seccomp filter, the Landlock ruleset) and execs the command.  No Python
start per command; the fork and the ruleset cost well under a millisecond.

What the ruleset grants (:func:`libbroker.sandbox.landlock.ruleset` over the
command's :class:`~libbroker.sandbox.shape.Shape`): the profile's read paths
read-only (system dirs and Python's prefixes by default), its write paths
and the workdir read-write, a fresh private directory named by TMPDIR (the
host's /tmp is not granted), a few /dev nodes, and /proc read-only.
Network: TCP bind/connect are refused, except connect to the proxy port in
proxy mode (Landlock matches the port on any address); the seccomp filter
refuses every other socket (UDP, raw, netlink but ROUTE, unix).

What a process group kill would miss (a daemon that called setsid(), a double
fork) is caught by a reaper between the server and each command
(:mod:`libbroker.sandbox.reaper`): a child subreaper outside the sandbox that kills
everything left below it when the command ends.  Once it has forked the
command it execs the C version (libbroker/native/reaper.c) when built, so
that it does not live on as a copy-on-write twin of the server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import NoReturn

from libbroker import native
from libbroker.broker.executor import Child, Executor, restore_child_signals
from libbroker.broker.profile import Profile, command_environment, command_shape
from libbroker.errors import SandboxUnavailable, SpawnError
from libbroker.sandbox import cgroups, enter, landlock, pidns, reaper, seccomp
from libbroker.sandbox.exec import exec_or_exit, keep_only, report_and_exit
from libbroker.sandbox.kinds import LANDLOCK
from libbroker.sandbox.landlock_backend import ReaperLine

SETUP_FAILED = 125
TMP_PREFIX = "agent-broker-tmp-"


def landlock_rules(profile: Profile, workdir: str, tmp: str = "") -> landlock.Ruleset:
    """The ruleset of one command (ConfigError for a deny Landlock cannot enforce)."""
    shape = command_shape(profile, workdir, workdir, tmp)
    return landlock.shape_ruleset(shape)


class LandlockExecutor(Executor):
    """Forks the (single-threaded) server; the child applies Landlock and execs."""

    name = LANDLOCK

    def __init__(self, profile: Profile, workdir: str, server_env: Mapping[str, str]) -> None:
        try:
            self.abi = landlock.require()
        except SandboxUnavailable as exc:
            raise SandboxUnavailable(f"nono backend: {exc}") from None
        if seccomp.program(seccomp.Filter(sockets=True)) is None:
            raise SandboxUnavailable(f"nono backend: no seccomp filter for {os.uname().machine}")
        self.profile = profile
        self.rules = landlock_rules(profile, workdir)  # ConfigError now, not per command
        self.allow = profile.env_allow
        self.server_env = dict(server_env)
        reclaim_stale_tmp(tempfile.gettempdir())
        self.tmp_base = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        self.native_reaper = native.built("reaper")
        self._start_limits(profile.limits)
        self._joining: dict[str, object] = {}  # the next command's group, for _child
        self._probe()

    def describe(self) -> str:
        return f"nono (Landlock {self.abi})"

    def _probe(self) -> None:
        """Apply a ruleset once at startup, so a kernel that refuses fails now."""
        with open(os.devnull, "rb+") as null:
            fd = null.fileno()
            child = self.spawn(("true",), "/", (fd, fd, fd))
            _, status = os.waitpid(child.pid, 0)
            child.release()
        if os.waitstatus_to_exitcode(status) != 0:
            self.close()
            raise SandboxUnavailable("nono backend: applying a Landlock ruleset failed")

    def close(self) -> None:
        shutil.rmtree(self.tmp_base, ignore_errors=True)
        super().close()

    def spawn(self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int]) -> Child:
        try:
            tmp = tempfile.mkdtemp(dir=self.tmp_base)
        except OSError as exc:
            raise SpawnError(f"cannot create the private tmp: {exc.strerror}") from None
        env = command_environment(self.server_env, self.allow, tmpdir=tmp)
        try:
            control, tell = os.pipe()  # signal numbers for the reaper to send
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SpawnError(f"cannot create a pipe: {exc.strerror}") from None
        try:
            group = self._new_group(self.profile.limits)
            # The command (not its reaper) joins it in _child, before it execs.
            self._joining = group.entry()
            pid = os.fork()
        except OSError as exc:
            os.close(control)
            os.close(tell)
            shutil.rmtree(tmp, ignore_errors=True)
            if self._joining:
                cgroups.remove(group)
            self._joining = {}
            raise SpawnError(f"cannot fork or set the command's limits: {exc.strerror}") from None
        if pid == 0:
            self._reaper(argv, cwd, stdio, env, tmp, control)  # never returns
        self._joining = {}
        os.close(control)
        os.set_blocking(tell, False)  # a flood of signal frames must never stall the server
        return LandlockChild(pid, ReaperLine(tell), tmp, group)

    def _reaper(
        self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int],
        env: dict[str, str], tmp: str, control: int,
    ) -> None:  # fmt: skip
        """In the forked child: start the command below us, then outlive all it starts.

        See :mod:`libbroker.sandbox.reaper`.  The reaper stays outside the sandbox (the
        command cannot signal it) in a session of its own, keeps no fd but its
        end of the control pipe (not the server's sockets, not the command's
        stdio), and exits with the command's status once nothing the command
        started is left.
        """
        try:
            restore_child_signals()
            os.setsid()
            reaper.become_subreaper()

            def run() -> NoReturn:
                self._child(argv, cwd, stdio, env, tmp)

            child, watch, group = pidns.spawn_below(
                run, control, group=True, native_reaper=self.native_reaper
            )
        except BaseException as exc:  # the child must never return into the server's code
            report_and_exit(f"broker: sandbox setup failed: {exc}", SETUP_FAILED)
        pidns.become_reaper(child, watch, group=group, native_reaper=self.native_reaper)

    def _child(
        self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int],
        env: dict[str, str], tmp: str,
    ) -> NoReturn:  # fmt: skip
        """In the forked child: sandbox ourselves, then exec.  Always ends in exec or _exit."""
        try:
            restore_child_signals()
            os.setsid()
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            keep_only((0, 1, 2))
            os.chdir(cwd)
            cgroups.join_self(self._joining)  # while /sys/fs/cgroup is still reachable
            self._apply(tmp)
        except BaseException as exc:  # the child must never return into the server's code
            report_and_exit(f"broker: sandbox setup failed: {exc}", SETUP_FAILED)
        exec_or_exit(argv, env)

    def _apply(self, tmp: str) -> None:
        rules = landlock.Ruleset(
            (*self.rules.rules, landlock.Rule(tmp, writable=True, is_dir=True)),
            self.rules.tcp_connect,
        )
        enter.enter(rules, self.abi, seccomp.Filter(sockets=True))


class LandlockChild(Child):
    """A command in its own session below its reaper; its private tmp goes on release.

    ``pid`` is the reaper's, what the server waits for: it exits as the
    command did, once nothing the command started is left.  Signals are
    written to the reaper (:func:`libbroker.sandbox.reaper.supervise`), which sends
    them to the command's group while that group is still the command's;
    closing the pipe on release kills whatever is still running.
    """

    def __init__(
        self, pid: int, line: ReaperLine, tmp: str, group: cgroups.Group | None = None
    ) -> None:
        self.pid = pid
        self.line = line
        self.tmp: str | None = tmp
        self.group = group

    def send_signal(self, signum: int) -> None:
        self.line.signal(signum)

    def kill(self) -> None:
        self.send_signal(9)

    def release(self) -> None:
        super().release()  # the reaper is gone: nothing of the command is left
        self.line.release()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def reclaim_stale_tmp(parent: str) -> None:
    """Remove the private tmp bases of broker-servers that died without cleaning up.

    Each base is named after its server's pid; one whose pid is gone (a
    SIGKILLed server) is removed.  A base whose pid now belongs to another
    process is left alone: never remove what might be in use.
    """
    uid = os.getuid()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            pid = entry.name[len(TMP_PREFIX) :].split("-", 1)[0]
            if not entry.name.startswith(TMP_PREFIX) or not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid or entry.is_symlink():
                    continue
                if not os.path.exists(f"/proc/{pid}"):
                    shutil.rmtree(entry.path, ignore_errors=True)


EXECUTOR = LandlockExecutor
"""What :mod:`libbroker.broker.executor_choice` builds for this backend."""
