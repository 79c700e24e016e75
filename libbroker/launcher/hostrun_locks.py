"""Empty lock files that a create the live gate refused left behind: noted, then removed.

The kernel creates an ``O_CREAT`` file *before* it asks fanotify whether the open
may go on, so a create the gate refuses leaves its file, empty, and its creator,
told EPERM, never removes it.  For a lock (git's ``.git/index.lock``) that file
stops every later host git ("Another git process seems to be running") until
someone removes it by hand.  The gate that refused (the launcher's own,
:mod:`.hostrun_gate`, or the gate service, :mod:`.gate_service_conn`) notes such
a file with :meth:`Locks.note` *before* it answers, while the opener still waits
in its system call, and only when all of this is proven:

1. the name ends in ``.lock``, and the file is a regular file, empty, with one
   link, owned by the opener's fsuid (the service: by its session's user);
2. the opener's thread (the event names it: ``FAN_REPORT_TID``) is in ``open`` or
   ``openat`` with ``O_CREAT|O_EXCL``, as the kernel shows it
   (``/proc/TID/syscall``: the call's number and arguments while it waits).
   With ``O_EXCL`` an existing name fails with EEXIST before any open, so this
   very call made the file: it is no one else's lock and none of the user's
   files (a lock that was there before is never noted);
3. the file is pinned by an ``O_PATH`` fd (:class:`Noted`): its inode lives, so its
   number is no other file's, until the removal.

After the session's sweep each noted file goes by :func:`remove`, through a
directory fd beneath the gate's binds, its parents opened one name at a time
without following a link, and only when the name still holds that very inode
(device and number), a regular file with one link and no byte, that no one has
open (the kernel grants a write lease only then; held while it goes, an open
meanwhile waits for it).  It is renamed to a private name beside it, checked
again there, then unlinked; a file renamed onto the name meanwhile is put back.
Anything else is left: nothing of the user's is lost.  What ``/proc/TID/syscall``
cannot show (another architecture than x86_64 and aarch64, ``openat2``,
io_uring's opens, no ptrace access to the opener) is never noted: the file
stays, as it did before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time

from libbroker.launcher.hostrun_fs import parent_of
from libbroker.named_tuple import NamedTuple

SUFFIX = ".lock"
MAX_NOTED = 64  # pins one session holds: beyond, a refused create is not noted
RUNNING_FOR = 0.1  # s: the longest a woken opener is awaited back asleep (_syscall_of)
RUNNING_NAP = 0.0002  # s: between two reads of it
# The system calls whose flags /proc/TID/syscall shows, by machine: number -> the index
# of the flags among the arguments.  (A 32-bit task's numbers differ: on x86_64 its 2
# is fork, its 257 remap_file_pages, neither of which opens a file; on aarch64 its 56
# is not an open either.  x32's carry bit 30: not listed.)
OPENS = {"x86_64": {2: 1, 257: 2}, "aarch64": {56: 2}}
_CREATE_EXCL = os.O_CREAT | os.O_EXCL
_F_SETSIG, _F_SETLEASE, _F_WRLCK, _F_UNLCK = 10, 1024, 1, 2
_SIGURG = 23  # the lease break's signal, ignored by default (SIGIO's default kills)
_RENAME_NOREPLACE = 1


class Noted(NamedTuple):
    rel: str  # the kernel's name at the refusal, relative to the workdir
    dev: int
    ino: int
    comm: str  # the opener's name, for the line
    pin: int  # O_PATH fd on the file: its inode, and so its number, stays ours


def created_here(tid: int, machine: str | None = None) -> bool:
    """Whether thread ``tid`` is, as the kernel shows it, in open/openat with
    ``O_CREAT|O_EXCL`` (it waits on our answer: its call cannot change meanwhile)."""
    table = OPENS.get(machine or os.uname().machine)
    if table is None:
        return False
    try:
        fields = _syscall_of(tid)
        at = table.get(int(fields[0]))
        if at is None:
            return False
        flags = int(fields[1 + at], 16)
    except (OSError, ValueError, IndexError):  # "running", no ptrace access, gone
        return False
    return flags & _CREATE_EXCL == _CREATE_EXCL


def _syscall_of(tid: int) -> list[bytes]:
    """The fields of ``/proc/TID/syscall`` for a thread that waits on our answer.

    The kernel shows a thread's call only while it sleeps; "running" is its EAGAIN.  Our
    opener sleeps in fanotify's wait, but every answer to *any* event of the group wakes
    every waiter (one wait queue per group), and a woken one that is not yet answered
    only checks that and sleeps again.  So just after the gate answered another open
    (the service answers a burst of them when a stopped launcher's patience runs out),
    the opener often reads "running" although it is still in the very same call: on a
    loaded machine, half the time in test_gate_service_sessions.  Read again until it
    sleeps (microseconds; 1.3 ms at most in 1000 such wakes), within RUNNING_FOR:
    beyond, "running" stands, and the file is not noted (it stays, as before)."""
    deadline = 0.0
    while True:
        with open(f"/proc/{tid}/syscall", "rb") as fh:
            fields = fh.read().split()
        if fields != [b"running"]:
            return fields
        now = time.monotonic()
        if not deadline:
            deadline = now + RUNNING_FOR
        elif now >= deadline:
            return fields
        time.sleep(RUNNING_NAP)  # the CPU to the opener, which may be queued on ours


def opener(tid: int) -> tuple[int | None, str]:
    """(fsuid, name) of the thread ``tid``."""
    fsuid, name = None, ""
    try:
        with open(f"/proc/{tid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Name:"):
                    name = line[5:].strip().decode(errors="replace")
                elif line.startswith(b"Uid:"):
                    fsuid = int(line.split()[4])
                    break
    except (OSError, ValueError, IndexError):
        return None, ""
    return fsuid, name


def _empty_lock(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and st.st_nlink == 1


class Locks:
    """The files one session's gate refused to create, noted; :meth:`close` drops the pins."""

    def __init__(self, workdir: str, owner: int | None = None) -> None:
        """``workdir``: the kernel's name of it; ``owner``: the only opener uid noted (the
        service: its session's user), else any opener's own files."""
        self.workdir = workdir
        self.owner = owner
        self.noted: list[Noted] = []

    def note(self, fd: int, tid: int) -> None:
        """The event's file ``fd``, refused to thread ``tid``, noted when proven (above);
        before the answer.  Never raises: a note is only a removal later."""
        if len(self.noted) >= MAX_NOTED:
            return
        with contextlib.suppress(Exception):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not path.endswith(SUFFIX) or not path.startswith(self.workdir + "/"):
                return
            st = os.fstat(fd)
            if not _empty_lock(st) or any((n.dev, n.ino) == (st.st_dev, st.st_ino)
                                          for n in self.noted):
                return
            fsuid, comm = opener(tid)
            if fsuid is None or st.st_uid != fsuid or self.owner not in (None, fsuid):
                return
            if not created_here(tid):
                return
            pin = os.open(f"/proc/self/fd/{fd}", os.O_PATH | os.O_CLOEXEC)
            pinned = os.fstat(pin)
            if (pinned.st_dev, pinned.st_ino) != (st.st_dev, st.st_ino):
                os.close(pin)
                return
            self.noted.append(Noted(path[len(self.workdir) + 1:], st.st_dev, st.st_ino,
                                    comm, pin))

    def remove(self, root: int) -> list[str]:
        """Each noted file removed beneath ``root`` (the workdir, under the binds) when it
        is still the one noted (:func:`remove_each`); a line per removal; the pins closed."""
        lines, _ = remove_each(root, [(n.rel, n.dev, n.ino, n.comm) for n in self.noted])
        self.close()
        return lines

    def close(self) -> None:
        for one in self.noted:
            with contextlib.suppress(OSError):
                os.close(one.pin)
        self.noted = []


def remove_each(root: int, noted: list[tuple[str, int, int, str]]) -> tuple[list[str], list[str]]:
    """Each (rel, dev, ino, comm) removed beneath ``root`` when it is still that very file
    (:func:`remove`): a line per removal, and the names removed."""
    lines, gone = [], []
    for rel, dev, ino, comm in noted:
        with contextlib.suppress(OSError):
            if remove(root, rel, dev, ino) is None:
                lines.append(removed_line(rel, comm))
                gone.append(rel)
    return lines, gone


def removed_line(rel: str, comm: str) -> str:
    from libbroker.shellquote import shown

    return (f"agent-sandbox: removed {shown(rel)}: the empty lock file that a host "
            f"process's create, refused by the live guard, left ({shown(comm or '?')})")


def remove(root: int, rel: str, dev: int, ino: int) -> str | None:
    """``rel`` (beneath the directory fd ``root``) removed if it is still the empty
    regular file ``dev``/``ino`` with one link that no one has open; None then, else
    why it was left.  The caller keeps the inode pinned meanwhile (its number is then
    no other file's)."""
    with parent_of(root, rel) as (parent, name):
        if parent < 0:
            return "its directory is gone"
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError:
            return "gone"
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino) or not _empty_lock(st):
                return "another file, or not empty"
            # The very inode (through the fd, no name): for the lease, never a fifo's open.
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(fd)
        try:
            return _leased_unlink(rfd, parent, name, dev, ino)
        finally:
            os.close(rfd)


def _leased_unlink(rfd: int, parent: int, name: str, dev: int, ino: int) -> str | None:
    import fcntl

    st = os.fstat(rfd)
    if (st.st_dev, st.st_ino) != (dev, ino) or not _empty_lock(st):
        return "another file, or not empty"
    try:
        fcntl.fcntl(rfd, _F_SETSIG, _SIGURG)
        fcntl.fcntl(rfd, _F_SETLEASE, _F_WRLCK)  # only while no one else has it open
    except OSError as exc:
        return "open by a process" if exc.errno == errno.EAGAIN else \
            f"no lease ({exc.strerror})"
    try:
        return _unlink_exactly(parent, name, dev, ino)
    finally:
        with contextlib.suppress(OSError):
            fcntl.fcntl(rfd, _F_SETLEASE, _F_UNLCK)


def _unlink_exactly(parent: int, name: str, dev: int, ino: int) -> str | None:
    """``name`` renamed aside (never over anything), checked there, unlinked; whatever
    else was renamed onto ``name`` meanwhile is put back."""
    from libbroker.sandbox.libc import check, libc

    aside = f".agent-sandbox-lock-{os.urandom(8).hex()}"  # (secrets: hashlib, random)
    check(libc().renameat2(parent, os.fsencode(name), parent, os.fsencode(aside),
                           _RENAME_NOREPLACE), "renameat2")
    st = os.stat(aside, dir_fd=parent, follow_symlinks=False)
    if (st.st_dev, st.st_ino) == (dev, ino) and _empty_lock(st):
        os.unlink(aside, dir_fd=parent)
        return None
    try:
        check(libc().renameat2(parent, os.fsencode(aside), parent, os.fsencode(name),
                               _RENAME_NOREPLACE), "renameat2")
    except OSError:
        return f"another file, left as {aside} (its name was taken again)"
    return "another file (put back)"
