"""The Landlock backend, through nono-py: a fresh ruleset per command.

The server imports nono_py once (it costs ~0.2 s) and, for each command,
forks itself: the child (one thread, a copy of a warm interpreter) builds the
ruleset, applies it to itself and execs the command.  No Python start per
command; the fork and the ruleset cost well under a millisecond each.

What the ruleset grants: the profile's read paths read-only (system dirs and
Python's prefixes by default), its write paths and the workdir read-write, a
fresh private directory named by TMPDIR (the host's /tmp is not granted), a
few /dev nodes, and /proc read-only.  The child drops every capability and
sets no_new_privs first: with CAP_SYS_PTRACE (a root server) it could read
/proc/<server pid>/environ; without it Landlock's ptrace scoping refuses.
Network: TCP bind/connect are refused, except connect to the
proxy port in proxy mode (Landlock matches the port on any address).

Landlock alone leaves UDP and netlink sockets open, so the ruleset goes on
with nono's seccomp network baseline (``apply_seccomp_with_abi``), which
refuses them; abstract unix sockets and signals to processes outside the
sandbox are refused by Landlock's scoping (ABI 6).

Limits, stated honestly (bwrap has none of them):
- Landlock grants are hierarchical and cannot subtract: a ``deny`` inside a
  granted tree cannot be enforced, so such a profile is refused for this
  backend.  A grant inside a denied tree is simply not made (deny wins).
- connect() to a path-named unix socket is not mediated by Landlock (the
  person's gpg-agent or docker socket would be reachable by name), so a
  seccomp filter refuses creating unix sockets at all
  (:mod:`libbroker.seccomp_unix`); socketpair() still works.  32-bit and x32
  syscalls are refused with it.

What a process group kill would miss (a daemon that called setsid(), a double
fork) is caught by a reaper between the server and each command
(:mod:`libbroker.reaper`): a child subreaper outside the sandbox that kills
everything left below it when the command ends.  Once it has forked the
command it execs the C version (libbroker/native/reaper.c) when built, so
that it does not live on as a copy-on-write twin of the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from libbroker import native, reaper, seccomp_unix
from libbroker.errors import ConfigError, SandboxUnavailable, SpawnError
from libbroker.exec_command import exec_or_exit, report_and_exit
from libbroker.executor import Child, Executor, restore_child_signals
from libbroker.paths import under
from libbroker.profile import Profile, command_environment

Rule = tuple[str, str, bool]  # path, "r" or "rw", is a directory

DEV_NODES: tuple[tuple[str, str], ...] = (
    ("/dev/null", "rw"),
    ("/dev/zero", "r"),
    ("/dev/full", "rw"),
    ("/dev/random", "r"),
    ("/dev/urandom", "r"),
)

SETUP_FAILED = 125


def landlock_rules(profile: Profile, workdir: str) -> list[Rule]:
    """The static part of every command's ruleset; ConfigError for an unenforceable deny."""
    grants = [(p, "r") for p in profile.read] + [(p, "rw") for p in profile.write]
    grants.append((workdir, "rw"))
    rules: list[Rule] = []
    for path, mode in grants:
        if any(under(path, d) for d in profile.deny):
            continue  # deny wins: a grant inside a denied tree is not made
        inside = [d for d in profile.deny if under(d, path)]
        if inside:
            raise ConfigError(
                f"nono backend: Landlock cannot deny {inside[0]} inside the granted {path}; "
                "use --sandbox=bwrap or change the profile"
            )
        if os.path.isdir(path):
            rules.append((path, mode, True))
        elif os.path.exists(path):
            rules.append((path, mode, False))
    rules += [(node, mode, False) for node, mode in DEV_NODES if os.path.exists(node)]
    # /proc read-only: what matters in it (environ, mem, fd/ of processes
    # outside the sandbox) is behind ptrace checks, which Landlock scopes to
    # the command's own domain once capabilities are dropped.
    rules.append(("/proc", "r", True))
    return rules


class LandlockExecutor(Executor):
    """Forks the (single-threaded) server; the child applies Landlock and execs."""

    name = "nono"

    def __init__(self, profile: Profile, workdir: str, server_env: Mapping[str, str]) -> None:
        try:
            import nono_py
        except ImportError:
            raise SandboxUnavailable("nono backend: nono-py is not installed") from None
        try:
            self.abi = nono_py.detect_abi()
        except RuntimeError as exc:
            raise SandboxUnavailable(f"nono backend: Landlock is not available: {exc}") from None
        self.nono: Any = nono_py
        self.profile = profile
        if not seccomp_unix.supported():
            raise SandboxUnavailable(
                "nono backend: no unix-socket seccomp filter for this machine; use bwrap"
            )
        self.rules = landlock_rules(profile, workdir)
        self.caps = self._static_caps()
        self.allow = profile.env_allow
        self.server_env = dict(server_env)
        self.tmp_base = tempfile.mkdtemp(prefix="agent-broker-tmp-")
        self.native_reaper = native.built("reaper")
        self._probe()

    def describe(self) -> str:
        return f"nono (Landlock {self.abi.version})"

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
            pid = os.fork()
        except OSError as exc:
            os.close(control)
            os.close(tell)
            shutil.rmtree(tmp, ignore_errors=True)
            raise SpawnError(f"cannot fork: {exc.strerror}") from None
        if pid == 0:
            self._reaper(argv, cwd, stdio, env, tmp, control)  # never returns
        os.close(control)
        os.set_blocking(tell, False)  # a flood of signal frames must never stall the server
        return LandlockChild(pid, tell, tmp)

    def _reaper(
        self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int],
        env: dict[str, str], tmp: str, control: int,
    ) -> None:  # fmt: skip
        """In the forked child: start the command below us, then outlive all it starts.

        See :mod:`libbroker.reaper`.  The reaper stays outside the sandbox (the
        command cannot signal it) in a session of its own, keeps no fd but its
        end of the control pipe (not the server's sockets, not the command's
        stdio), and exits with the command's status once nothing the command
        started is left.
        """
        try:
            restore_child_signals()
            os.setsid()
            reaper.become_subreaper()
            command = os.fork()
        except BaseException as exc:  # the child must never return into the server's code
            report_and_exit(f"broker: sandbox setup failed: {exc}", SETUP_FAILED)
        if command == 0:
            os.close(control)
            self._child(argv, cwd, stdio, env, tmp)  # never returns
        try:
            os.closerange(0, control)
            os.closerange(control + 1, 65536)
            if self.native_reaper is not None:  # a few hundred KiB, not a copy of the server
                os.set_inheritable(control, True)
                with contextlib.suppress(OSError):
                    os.execv(self.native_reaper, ["reaper", str(command), str(control), "1"])  # noqa: S606
            reaper.supervise(command, control)
        except BaseException:
            os._exit(SETUP_FAILED)

    def _child(
        self, argv: tuple[str, ...], cwd: str, stdio: tuple[int, int, int],
        env: dict[str, str], tmp: str,
    ) -> None:  # fmt: skip
        """In the forked child: sandbox ourselves, then exec.  Always ends in exec or _exit."""
        try:
            restore_child_signals()
            os.setsid()
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            os.chdir(cwd)
            self._apply(tmp)
        except BaseException as exc:  # the child must never return into the server's code
            report_and_exit(f"broker: sandbox setup failed: {exc}", SETUP_FAILED)
        exec_or_exit(argv, env)

    def _static_caps(self) -> Any:
        """The ruleset part shared by every command, built once in the server.

        Each forked child inherits a copy and adds its own tmp and /proc entry,
        so a spawn does not re-validate a dozen paths.
        """
        nono = self.nono
        caps = nono.CapabilitySet()
        modes = {"r": nono.AccessMode.READ, "rw": nono.AccessMode.READ_WRITE}
        for path, mode, is_dir in self.rules:
            if is_dir:
                caps.allow_path(path, modes[mode])
            else:
                caps.allow_file(path, modes[mode])
        caps.block_network()
        if self.profile.proxy_port is not None:
            caps.allow_tcp_connect_port(self.profile.proxy_port)
        return caps

    def _apply(self, tmp: str) -> None:
        nono = self.nono
        caps = self.caps
        caps.allow_path(tmp, nono.AccessMode.READ_WRITE)
        drop_privileges()
        seccomp_unix.install()
        # Landlock plus nono's seccomp network baseline: Landlock alone leaves
        # UDP and netlink open; the baseline refuses them, TCP stays Landlock's.
        nono.apply_seccomp_with_abi(caps, self.abi)


class LandlockChild(Child):
    """A command in its own session below its reaper; its private tmp goes on release.

    ``pid`` is the reaper's, what the server waits for: it exits as the
    command did, once nothing the command started is left.  Signals are
    written to the reaper (:func:`libbroker.reaper.supervise`), which sends
    them to the command's group while that group is still the command's;
    closing the pipe on release kills whatever is still running.
    """

    def __init__(self, pid: int, control: int, tmp: str) -> None:
        self.pid = pid
        self.control: int | None = control
        self.tmp: str | None = tmp

    def send_signal(self, signum: int) -> None:
        if self.control is not None and 0 < signum < 256:
            # Gone (EPIPE) or a full pipe (a flood): nothing to deliver it to, or one of many.
            with contextlib.suppress(OSError):
                os.write(self.control, bytes([signum]))

    def kill(self) -> None:
        self.send_signal(9)

    def release(self) -> None:
        if self.control is not None:
            os.close(self.control)
            self.control = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


# --- privileges (ctypes; the server imports this once) ----------------------

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 63


_LAST_CAP = _last_cap()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_privileges() -> None:
    """no_new_privs, and no capabilities now or after exec (the server may run as root).

    Landlock stops file access even for root, but not what capabilities allow
    beside it (raw sockets, ptrace of other processes, ...).
    """
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    for cap in range(_LAST_CAP + 1):
        # EPERM without CAP_SETPCAP: then there is nothing to drop (an
        # unprivileged bounding set is inert under no_new_privs).
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
