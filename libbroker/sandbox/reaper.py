"""Nothing a command starts outlives it, setsid() or not.

A process group kill misses whatever left the group: a daemon that called
setsid(), a double fork.  bwrap's PID namespace catches those; Landlock has
no such thing.  So the Landlock backend puts a reaper between the server and
each command: a process that has declared itself a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``), so that every orphan below it is reparented to
it instead of to init, and that, once the command has ended, kills every
process still below it and exits as the command did (:func:`supervise`).

The server never signals the command by pid: the command's pid (and so its
process group id) may be reused once the reaper has reaped it, which only
the reaper knows.  The server writes signal numbers to a pipe instead, and
the reaper sends them while the command is unreaped.  Closing the pipe
(the server ended, however) kills the command.

The sandboxed command cannot signal the reaper: Landlock's signal scoping
(ABI 6) refuses signals to processes outside the sandbox's domain, and the
reaper is outside it.

Killing by pid races pid reuse, so each process is opened as a pidfd first,
checked to still be below the reaper (its parent one of ours), and signalled
through the pidfd: a pid reused by an unrelated process in between is never
signalled.  :func:`descendants` is pure; the rest reads /proc.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

from libbroker.sandbox.libc import check, libc

if TYPE_CHECKING:
    import signal
else:  # the C module: signal.py's enum wrappers cost the launcher ~0.7 ms before go
    import _signal as signal

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make orphans below this process its children (OSError if refused)."""
    check(libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """Every pid whose chain of parents in ``parents`` (pid -> ppid) reaches ``root``.

    Parents come before their children in the result.
    """
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    queue = [root]
    seen = {root}
    while queue:
        for child in children.get(queue.pop(), ()):
            if child not in seen:  # a malformed table must not loop
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found


def parent_of(pid: int) -> int | None:
    """``pid``'s parent from /proc (None once it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        # The name (field 2) may hold any byte, ")" included: split after the last.
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_parents() -> dict[int, int]:
    """pid -> ppid for every process /proc shows."""
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = parent_of(int(name))
            if ppid is not None:
                table[int(name)] = ppid
    return table


def kill_below(root: int, keep: frozenset[int] = frozenset()) -> None:
    """SIGKILL every process below ``root`` (this process), and reap its children.

    Returns once this process has no child left but those in ``keep`` (and
    what is below them): the launcher's janitor must outlive this, its work
    (the sweep) comes after.  Each kill goes through a pidfd opened after the
    process was found and checked again, so a pid that was reused in between
    is left alone.
    """
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass  # reap what has ended already
        except ChildProcessError:
            return  # no child at all, so nothing below us: the usual end, no /proc scan
        if keep and _children_kept(root, keep):
            return  # the launcher's usual end (its janitor alone): no /proc scan either
        parents = process_parents()
        found = [pid for pid in descendants(root, parents) if not _kept(pid, keep, parents)]
        if not found:
            return  # only the kept ones are left
        ours = {root, *found}
        for pid in found:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if parent_of(pid) in ours:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, 0)  # one of ours has died (orphans below are ours now)


def _children_kept(root: int, keep: frozenset[int]) -> bool:
    """Whether every child of ``root`` (this process, its zombies reaped) is in ``keep``.

    Then nothing below us is left to kill but what is kept: a descendant's chain
    of parents ends at a child of ours, and an orphan becomes our child (we are a
    subreaper) before its parent can be reaped; a parent dying while we read is
    still our child, not kept, so the scan runs.  Each thread's ``children`` file
    (a child is listed under the thread that forked it); False if one is unreadable.
    """
    try:
        tasks = os.listdir(f"/proc/{root}/task")
        children: set[int] = set()
        for task in tasks:
            with open(f"/proc/{root}/task/{task}/children", "rb") as fh:
                children.update(int(p) for p in fh.read().split())
    except (OSError, ValueError):
        return False
    return children <= keep


def _kept(pid: int, keep: frozenset[int], parents: Mapping[int, int]) -> bool:
    """Whether ``pid`` is in ``keep`` or below one of them (by ``parents``)."""
    seen: set[int] = set()
    while pid not in seen:  # a malformed table must not loop
        if pid in keep:
            return True
        seen.add(pid)
        parent = parents.get(pid)
        if parent is None:
            return False
        pid = parent
    return False


def exit_as(status: int) -> NoReturn:
    """End this process the way ``status`` (a wait status) says its command ended."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        # Each step alone: SIGKILL's disposition cannot be set (EINVAL), and it need not be.
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal that does not end a process
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def supervise(command: int, control: int, *, group: bool = True) -> NoReturn:
    """Run the reaper's side until the end: never returns.

    Until ``command`` (our child) ends, every byte read from ``control`` is
    a signal number for the command's process group (``group``; else for
    the command alone), sent from here because only this process knows the
    command is not yet reaped (so that id is still the command's); end of
    file on ``control`` (whoever holds the other end is gone) kills it.
    Orphans that die meanwhile are reaped.  Then everything left below us
    is killed, and we exit as the command did.
    """
    send = os.killpg if group else os.kill
    try:
        pidfd = os.pidfd_open(command)
    except OSError:  # fail closed: a command nobody watches does not run on
        with contextlib.suppress(OSError):
            os.kill(command, signal.SIGKILL)  # our unreaped child: the pid is still its own
        kill_below(os.getpid())
        raise
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    status = None
    while status is None:
        ready = dict(poller.poll(1000))  # the timeout reaps orphans of a long command
        if control in ready:
            try:
                data = os.read(control, 256)
            except OSError:
                data = b""
            if not data:  # the server is gone: so is the command
                poller.unregister(control)
                data = bytes([signal.SIGKILL])
            for signum in data:
                with contextlib.suppress(OSError):
                    send(command, signum)
        status = _reaped(command)
    kill_below(os.getpid())
    exit_as(status)


def _reaped(command: int) -> int | None:
    """Reap every child that has ended; the command's wait status if it was one."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 255 << 8  # the command is not ours after all: a failure
        if pid == 0:
            return None
        if pid == command:
            return status


def main(argv: list[str]) -> int:
    """``python3 -m libbroker.sandbox.reaper COMMAND CONTROL_FD GROUP``: as native/reaper.c.

    The same interface as the C program, so the tests run both side by side.
    """
    if len(argv) != 3 or not all(a.isdigit() for a in argv) or argv[2] not in ("0", "1"):
        os.write(2, b"usage: reaper COMMAND CONTROL_FD GROUP(0|1)\n")
        return 125
    try:
        supervise(int(argv[0]), int(argv[1]), group=argv[2] == "1")
    except OSError as exc:
        os.write(2, f"agent-sandbox reaper: cannot watch the command: {exc.strerror}\n".encode())
    return 125


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
