"""fanotify(7) permission events through ctypes: the live guard's gate (:mod:`.hostrun_gate`).

A group of class ``FAN_CLASS_CONTENT`` holds each open (and each exec) of a
file on a marked mount until the listener answers ``allow`` or ``deny``; a
denied open fails with EPERM.  Needs CAP_SYS_ADMIN (:func:`available` says
whether this process has it).  When the group's fd closes (the listener's
process ends, or :meth:`Fanotify.close`), the kernel allows every pending
event and drops the marks: a dead listener never hangs the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct

from libbroker.sandbox.libc import fail, libc

_CLOEXEC, _CLASS_CONTENT, _UNLIMITED_QUEUE, _REPORT_TID = 0x1, 0x4, 0x10, 0x100
_MARK_ADD, _MARK_MOUNT, _MARK_FLUSH = 0x1, 0x10, 0x80
_DONT_FOLLOW, _ONLYDIR, _IGNORED_MASK, _IGNORED_SURV_MODIFY = 0x4, 0x8, 0x20, 0x40
_OPEN = 0x20
_AT_FDCWD = -100
OPEN_PERM, OPEN_EXEC_PERM = 0x10000, 0x40000
Q_OVERFLOW = 0x4000
ALLOW, DENY = 0x1, 0x2
_META = struct.Struct("IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_RESPONSE = struct.Struct("iI")  # fd, response
_CAP_SYS_ADMIN = 21


class Event:
    __slots__ = ("fd", "mask", "pid")

    def __init__(self, fd: int, mask: int, pid: int) -> None:
        self.fd, self.mask, self.pid = fd, mask, pid


def available() -> bool:
    """Whether this process may make a permission group (CAP_SYS_ADMIN in its effective set)."""
    return has_capability(_CAP_SYS_ADMIN)


def has_capability(cap: int) -> bool:
    """Whether capability number ``cap`` is in this process's effective set."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError):
        pass
    return False


class Fanotify:
    """One permission group (blocking reads: the gate polls it)."""

    def __init__(self, *, report_tid: bool = False) -> None:
        """``report_tid``: events name the opening thread, not its process (the gate
        service reads the thread's own credentials)."""
        c = libc()
        c.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int,
                                    ctypes.c_char_p]
        # An unlimited queue: a permission event the kernel could not queue is *allowed*.
        flags = _CLOEXEC | _CLASS_CONTENT | _UNLIMITED_QUEUE | (_REPORT_TID if report_tid else 0)
        fd = c.fanotify_init(flags,
                             os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_LARGEFILE", 0))
        if fd < 0:
            fail("fanotify_init")
        self.fd: int = fd

    def mark_mount(self, dfd: int, mask: int = OPEN_PERM | OPEN_EXEC_PERM) -> None:
        """Every open of a file on the mount ``dfd`` (an ordinary directory fd) lies on."""
        if libc().fanotify_mark(self.fd, _MARK_ADD | _MARK_MOUNT, mask, dfd, None) != 0:
            fail("fanotify_mark")

    def flush_mounts(self) -> None:
        """Every mount mark of the group removed at once (no open waits on it any more).

        Why before :meth:`close` (the gate's end): closing a group that still has marks
        frees their connectors (a work item that waits for an SRCU grace period) and at
        once waits for the marks' own grace period; the second, asked during the first or
        within 25 us of its end, is never expedited: a normal one, 2 jiffies and more
        (8 to 25 ms at HZ=250).  Flushed first, the connectors' grace period runs by
        itself while the binds go, and the close waits for an expedited one."""
        if libc().fanotify_mark(self.fd, _MARK_FLUSH | _MARK_MOUNT, 0, _AT_FDCWD, None) != 0:
            fail("fanotify_mark flush")

    def hold(self, path: str) -> None:
        """An inert mark on the directory at ``path`` (an ignore mask for an event the group
        never asks for; the last component never followed): its inode's fsnotify connector
        lives while the mark does (:meth:`flush_inodes`).  Why: the watcher's inotify close
        then frees no connector, and waits for an expedited grace period alone."""
        flags = _MARK_ADD | _IGNORED_MASK | _IGNORED_SURV_MODIFY | _DONT_FOLLOW | _ONLYDIR
        if libc().fanotify_mark(self.fd, flags, _OPEN, _AT_FDCWD, os.fsencode(path)) != 0:
            fail("fanotify_mark hold")

    def flush_inodes(self) -> None:
        """Every inode mark of the group (:meth:`hold`) removed at once."""
        if libc().fanotify_mark(self.fd, _MARK_FLUSH, 0, _AT_FDCWD, None) != 0:
            fail("fanotify_mark flush")

    def read(self) -> list[Event]:
        """The events queued now (blocks until there is one)."""
        data = os.read(self.fd, 1 << 14)
        out, at = [], 0
        while at + _META.size <= len(data):
            size, _, _, _, mask, fd, pid = _META.unpack_from(data, at)
            out.append(Event(fd, mask, pid))
            at += max(size, _META.size)
        return out

    def answer(self, event: Event, allow: bool) -> None:
        """Release the process waiting on ``event``, and close the event's fd."""
        try:
            os.write(self.fd, _RESPONSE.pack(event.fd, ALLOW if allow else DENY))
        finally:
            os.close(event.fd)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):  # closed under us already: the group is gone
                os.close(fd)
