"""The live guard's file steps: bounded reads, new files, atomic replaces under git's lock.

Every name is one component relative to a directory fd, opened with
O_NOFOLLOW (a link in the agent's tree is never followed), and every file is
judged by what its open fd says.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

MAX_CONFIG = 256 << 10
NOT_A_CONFIG = f"(not a regular file of at most {MAX_CONFIG >> 10} KiB)"
LOCK_WAIT = 0.2  # seconds a config.lock may be held before it counts as stale
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

def read_small(dfd: int, name: str, limit: int = MAX_CONFIG) -> bytes | None:
    """The bytes of the regular file ``name`` in ``dfd``; None if it is not one or too big."""
    try:
        fd = os.open(name, O_FILE, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return None if len(data) > limit else data
    finally:
        os.close(fd)


def write_new(dfd: int, name: str, data: bytes, mode: int, *, sync: bool = False) -> None:
    """Create ``name`` in ``dfd`` (it must not exist) holding ``data`` with ``mode``."""
    fd = os.open(name, O_NEW, 0o600, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace(dfd: int, name: str, data: bytes, mode: int, *, tmp: str = "",
            sync: bool = False) -> None:
    """Atomically make ``name`` in ``dfd`` a regular file holding ``data`` (a link is replaced,
    never followed).  ``tmp``: the name written first (``config.lock``: git's own lock)."""
    tmp = tmp or f".{name}.agent-sandbox-new"
    if not tmp.endswith(".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
    write_new(dfd, tmp, data, mode, sync=sync)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def read_at(path: str, name: str) -> bytes | None:
    try:
        dfd = os.open(path, O_DIR)
    except OSError:
        return None
    try:
        return read_small(dfd, name)
    finally:
        os.close(dfd)


def take_lock(dfd: int, lock: str) -> int:
    """git's lock on a config (``config.lock``, O_EXCL), waited for up to LOCK_WAIT.

    A git writing holds it for a millisecond; one held longer is a stale or
    planted lock that would keep the config from being cleaned: it is taken
    over (removed), as git itself says to do with a stale lock.
    """
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            return os.open(lock, O_NEW, 0o600, dir_fd=dfd)
        except FileExistsError:
            if time.monotonic() > deadline:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock, dir_fd=dfd)
            else:
                time.sleep(0.002)


def swap_locked(dfd: int, name: str, expect: bytes | None, data: bytes, mode: int) -> bool:
    """Under git's lock, make ``name`` hold ``data`` if it still holds ``expect``.

    False when it changed since it was read (the caller merges again): a
    write of the session's git between our read and our rename is never lost.
    """
    lock = name + ".lock"
    fd = take_lock(dfd, lock)
    done = False
    try:
        if read_small(dfd, name) != expect:
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.close(fd)
        fd = -1
        os.rename(lock, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        done = True
        return True
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock, dir_fd=dfd)


def kind_at(dfd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def exchange(dfd1: int, name1: str, dfd2: int, name2: str) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE); OSError when it cannot be."""
    from libbroker.sandbox.libc import check, libc

    check(libc().renameat2(dfd1, os.fsencode(name1), dfd2, os.fsencode(name2), 2),
          "renameat2")


def put_in_place(host_dir: str, gfd: int, name: str, final: bytes, mode: int
                 ) -> os.stat_result | None:
    """A regular file holding ``final`` put in the link's place by an exchange of names
    (``renameat2(RENAME_EXCHANGE)``); its stat, or None where that cannot be (the caller
    writes it the old way).

    Not a rename over the link: ext4 writes out a file renamed over another name at
    once (``auto_da_alloc``), which cost milliseconds per repository.  The host's copy
    itself is exchanged where it can be (no new file: the state dir on the workdir's
    filesystem and mount), else a new file written beside the link."""
    ours = os.path.join(host_dir, "config")  # the link's target (hostrun_gitconfig)
    hfd = os.open(host_dir, O_DIR)
    try:
        fd = os.open("config", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=hfd)
        try:
            st = os.fstat(fd)
            usable = stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and (
                st.st_nlink == 1 and st.st_uid == os.geteuid()
                and read_small(hfd, "config") == final)
        finally:
            os.close(fd)
        if usable and _swapped(hfd, "config", gfd, name, ours):
            placed = os.stat(name, dir_fd=gfd, follow_symlinks=False)
            return placed if placed.st_ino == st.st_ino else None
    except OSError:  # EXDEV (another filesystem or mount: the live gate's binds), EINVAL
        pass
    finally:
        os.close(hfd)
    tmp = ".config.agent-sandbox-new"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=gfd)
        write_new(gfd, tmp, final, mode)
        if not _swapped(gfd, tmp, gfd, name, ours):
            return None
        os.unlink(tmp, dir_fd=gfd)  # our link, now by that name
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=gfd)
        return None
    return os.stat(name, dir_fd=gfd, follow_symlinks=False)


def _swapped(sfd: int, src: str, dfd: int, dst: str, ours: str) -> bool:
    """Exchange ``src`` and ``dst``; True if ``dst`` was our link (now ``src``), else both
    are put back.  OSError when the names cannot be exchanged."""
    exchange(sfd, src, dfd, dst)
    try:
        if os.readlink(src, dir_fd=sfd) == ours:
            return True
    except OSError:
        pass
    exchange(sfd, src, dfd, dst)
    return False
