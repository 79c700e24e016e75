"""inotify(7) through ctypes: the stdlib has no binding, and this is all the watcher needs.

Watches are added by directory fd (``/proc/self/fd/N``, which the kernel
resolves to exactly the directory that fd holds), so a directory renamed or
replaced by a link between our open and the watch cannot redirect it.
"""

from __future__ import annotations

import os
import struct

from libbroker.sandbox.libc import fail, libc

MODIFY, ATTRIB, CLOSE_WRITE = 0x2, 0x4, 0x8
MOVED_FROM, MOVED_TO, CREATE, DELETE = 0x40, 0x80, 0x100, 0x200
DELETE_SELF, MOVE_SELF = 0x400, 0x800
Q_OVERFLOW, IGNORED, ISDIR = 0x4000, 0x8000, 0x40000000
ONLYDIR, EXCL_UNLINK = 0x1000000, 0x4000000
_NONBLOCK, _CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


class Event:
    __slots__ = ("mask", "name", "wd")

    def __init__(self, wd: int, mask: int, name: str) -> None:
        self.wd, self.mask, self.name = wd, mask, name


class Inotify:
    """One inotify instance (non-blocking, close-on-exec)."""

    def __init__(self) -> None:
        fd = libc().inotify_init1(_NONBLOCK | _CLOEXEC)
        if fd < 0:
            fail("inotify_init1")
        self.fd: int = fd

    def add(self, dfd: int, mask: int) -> int:
        """Watch the directory ``dfd`` holds; its watch descriptor."""
        path = f"/proc/self/fd/{dfd}".encode()
        wd: int = libc().inotify_add_watch(self.fd, path, mask | ONLYDIR)
        if wd < 0:
            fail("inotify_add_watch")
        return wd

    def read(self) -> list[Event]:
        """The events queued now ([] when none)."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out, at = [], 0
        while at + _HEADER.size <= len(data):
            wd, mask, _, size = _HEADER.unpack_from(data, at)
            at += _HEADER.size
            raw = data[at:at + size].split(b"\0", 1)[0]
            at += size
            out.append(Event(wd, mask, os.fsdecode(raw)))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
