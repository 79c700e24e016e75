"""A PID namespace of its own for a Landlock sandbox, where the kernel allows one.

Landlock scopes signals and ptrace to the sandbox, so other processes'
environment and memory are out of reach, but ``/proc/PID/cmdline`` needs no
ptrace check: every process's command line (a token passed as an argument,
a path) would be readable.  bwrap hides them with a PID namespace and a
fresh /proc; this module does the same for the Landlock backend, with the
unprivileged user namespace that most kernels allow:

    reaper (outside)  --  unshare(NEWUSER | NEWPID), uid/gid mapped to themselves
      init (pid 1)    --  unshare(NEWNS), / made private, a fresh /proc and a
                          devpts of its own (no other terminal of the user);
                          then the reaper's job for the command (signals from
                          the control pipe, everything killed when it ends)
        command       --  the one hardening sequence (enter.py), then exec

The outer reaper watches the init through a pipe the init holds, and exits
as it did.  When the init ends, the kernel kills whatever is left in the
namespace, so nothing the command started can outlive it, setsid() or not.

Where unprivileged user namespaces are refused (a sysctl, an LSM), nothing
changes: the command runs below the reaper as before, and other processes'
command lines stay visible (doctor and the README say so).  The user id
inside is the user's own, mapped to itself; every capability the new
namespace grants is dropped again by :func:`~libbroker.sandbox.enter.enter`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable
from typing import NoReturn

from libbroker.sandbox import reaper
from libbroker.sandbox.exec import keep_only
from libbroker.sandbox.libc import check, libc

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 0x1000, 0x4000, 0x40000
_MS_RDONLY, _MS_REMOUNT = 1, 0x20
# What a kernel that refuses unprivileged user namespaces answers.
_REFUSED = {errno.EPERM, errno.EINVAL, errno.ENOSPC, errno.EUSERS, errno.ENOSYS, errno.EACCES}
SETUP_FAILED = 125


def unshare_pids() -> bool:
    """New user and PID namespaces for our children; False when the kernel refuses."""
    uid, gid = os.getuid(), os.getgid()
    if libc().unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        if err in _REFUSED:
            return False
        raise OSError(err, f"unshare: {os.strerror(err)}")
    # Map our own ids to themselves: files keep their owners, and nothing new is granted.
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    return True


def own_proc(binds: tuple[tuple[str, str], ...] = (), links: tuple[str, ...] = (),
             holds: tuple[str, ...] = ()) -> None:
    """In the namespace's init: a mount namespace whose /proc shows only the namespace,
    and whose /dev/pts holds only the sandbox's own terminals; each of ``binds``
    (host directory, path) bound read-write over that path, in this namespace
    only (the session's private copies of the repositories' git configs:
    libbroker.launcher.hostrun_gitconfig).

    The host's /dev/pts would let the sandbox open the user's other terminals
    (another shell's pty, where a password is typed) by path; a new devpts
    instance, with /dev/ptmx bound to its own, shows none of them.  The
    session's own terminal stays reachable through the descriptors it was
    given and /dev/tty.
    """
    c = libc()
    check(c.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private first: the new mounts must not propagate back to the host's.
    check(c.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    check(c.mount(b"proc", b"/proc", b"proc", flags, None), "mount proc")
    if os.path.isdir("/dev/pts"):
        pts = b"newinstance,ptmxmode=0666,mode=0620"
        check(c.mount(b"devpts", b"/dev/pts", b"devpts", _MS_NOSUID | _MS_NOEXEC, pts),
               "mount devpts")
        check(c.mount(b"/dev/pts/ptmx", b"/dev/ptmx", None, _MS_BIND, None),
               "mount --bind /dev/pts/ptmx /dev/ptmx")
    for src, dst in binds:
        check(c.mount(os.fsencode(src), os.fsencode(dst), None, _MS_BIND, None),
              f"mount --bind {src} {dst}")
    for path in holds:  # the workdir's host-run entries, as bwrap's --ro-bind holds them
        raw = os.fsencode(path)
        check(c.mount(raw, raw, None, _MS_BIND | _MS_REC, None), f"mount --bind {path}")
        check(c.mount(None, raw, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_REC, None),
              f"mount -o remount,bind,ro {path}")
    if links:  # the config links cannot be replaced inside (libbroker.sandbox.holdlink)
        from libbroker.sandbox.holdlink import hold_links

        hold_links(links)


def spawn_below(
    run: Callable[[], NoReturn], control: int, *, group: bool, native_reaper: str | None,
    init: Callable[[int], NoReturn] | None = None,
) -> tuple[int, int, bool]:
    """In a reaper: start the command (``run``, in a forked child) below us.

    Returns what this reaper then supervises: (child, its control fd, group).
    Without a namespace that is the command itself with ``control``.  With
    one it is the init, watched through a pipe that closes when it ends
    (group False: the init is signalled by pipe, never by a signal); the
    init supervises the command with ``control``.  ``init``: the init's own
    course, given the watch pipe's write end, instead of :func:`_init`'s (the
    Landlock session's helper makes the command first, the mount namespace
    later: :mod:`.landlock_helper`).
    """
    if not unshare_pids():
        command = os.fork()
        if command == 0:
            os.close(control)
            run()
        return command, control, group
    watch_r, watch_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(watch_r)
        if init is not None:
            init(watch_w)
        _init(run, control, watch_w, group=group, native_reaper=native_reaper)
    os.close(watch_w)
    os.close(control)
    return pid, watch_r, False


def _init(
    run: Callable[[], NoReturn], control: int, watch: int, *, group: bool,
    native_reaper: str | None,
) -> NoReturn:  # fmt: skip
    """Pid 1 of the new namespace: its own /proc, the command, then the reaper's job."""
    try:
        own_proc()
        command = os.fork()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"agent-sandbox: cannot set up the PID namespace: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    if command == 0:
        os.close(control)
        os.close(watch)
        run()
    become_reaper(command, control, group=group, native_reaper=native_reaper, keep=(watch,))


def become_reaper(
    command: int, control: int, *, group: bool, native_reaper: str | None,
    keep: tuple[int, ...] = (),
) -> NoReturn:  # fmt: skip
    """Supervise ``command`` for the rest of this process's life (:mod:`.reaper`).

    Every descriptor but ``control`` and ``keep`` is closed first (not the
    server's sockets, not the command's stdio).  With the small C reaper
    built, this process execs it (a few hundred KiB instead of a copy of
    whoever forked us); else it stays Python.
    """
    try:
        keep_only((control, *keep))
        if native_reaper is not None:
            os.set_inheritable(control, True)
            for fd in keep:
                os.set_inheritable(fd, True)
            args = ["reaper", str(command), str(control), "1" if group else "0"]
            with contextlib.suppress(OSError):
                os.execv(native_reaper, args)  # noqa: S606
        reaper.supervise(command, control, group=group)
    except BaseException:
        os._exit(SETUP_FAILED)


def supported() -> bool:
    """Whether a PID namespace with its own /proc can be made here (forks a probe)."""
    return probed(probe())


def probed(pid: int) -> bool:
    """The answer of :func:`probe` ``pid`` (waits for it)."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def probe() -> int:
    """Start :func:`supported`'s probe (a forked child); :func:`probed` takes its answer, so
    the launcher overlaps it with the servers' start."""
    libc()  # loaded here, not in the child of a process with threads
    pid = os.fork()
    if pid == 0:
        try:
            ok = unshare_pids()
            if ok:
                inner = os.fork()
                if inner == 0:
                    try:
                        own_proc()
                        os._exit(0 if os.getpid() == 1 else 1)
                    except BaseException:
                        os._exit(1)
                ok = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1]) == 0
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(1)
    return pid
