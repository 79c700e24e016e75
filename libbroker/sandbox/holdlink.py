"""Make a symlink a mount point in a sandbox's mount namespace: it cannot be removed there.

A repository's ``.git/config`` is, for a session, a symlink to the host's copy
(:mod:`libbroker.launcher.hostrun_gitconfig`); the sandbox must not replace
it with a file of its own, which the host's git would read.  A mount point
cannot be unlinked or renamed over (EBUSY), and Linux's mount API can mount
a symlink itself onto a symlink: ``open_tree(AT_SYMLINK_NOFOLLOW |
OPEN_TREE_CLONE)`` then ``move_mount`` onto an ``O_PATH | O_NOFOLLOW`` fd of
the same link (5.2 and later).  The link still resolves as before, so git's
lockfile code, which follows it, works unchanged.

bwrap gives no hook for it, so :func:`hold_in` joins the namespace of a
process of the sandbox from a forked child of the launcher (setns: the user
namespace, which the sandbox's owner has every capability in, then the
mount namespace) before the command is started.  The Landlock helper's
namespace init calls :func:`hold_links` itself (:mod:`.pidns`).
"""

from __future__ import annotations

import os

from libbroker.sandbox.libc import fail, libc

_OPEN_TREE, _MOVE_MOUNT = 428, 429  # the same number on every architecture since 5.2
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW = -100, 0x100
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1)


def hold_links(paths: tuple[str, ...]) -> None:
    """In the current mount namespace: each symlink of ``paths`` mounted onto itself."""
    c = libc()
    for path in paths:
        tree = c.syscall(_OPEN_TREE, _AT_FDCWD, os.fsencode(path),
                         _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_SYMLINK_NOFOLLOW)
        if tree < 0:
            fail(f"open_tree {path}")
        try:
            target = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if c.syscall(_MOVE_MOUNT, tree, b"", target, b"",
                             _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH) != 0:
                    fail(f"move_mount {path}")
            finally:
                os.close(target)
        finally:
            os.close(tree)


class SandboxGone(OSError):
    """The sandbox exited before it was whole: nothing to hold (its start fails anyway)."""


_GONE = 2  # the hold's child's status for SandboxGone: nothing said, nothing held


def hold_in(inner: int, paths: tuple[str, ...], timeout: float) -> None:
    """:func:`hold_links` in the mount namespace of the sandbox whose first process is
    ``inner`` (bwrap's child, as its info fd names it), once bwrap has built it
    (:func:`sandbox_process`, within ``timeout`` seconds).

    A forked child does it: setns into a user namespace needs a single
    thread, and the launcher has several.  Forked as soon as ``inner`` is
    known, while bwrap builds the sandbox: the child waits for that itself,
    so the fork and the copies of the pages it touches (a few ms) are not
    paid after bwrap's exec, on the way to go.  OSError when it could not
    (the child says why on stderr); nothing when the sandbox exited first.
    """
    libc()  # loaded before the fork: the child imports nothing
    child = os.fork()
    if child == 0:
        code = 1
        try:
            _hold_in(sandbox_process(inner, timeout), paths)
            code = 0
        except SandboxGone:
            code = _GONE
        except BaseException as exc:
            os.write(2, f"agent-sandbox: holding the git config links: {exc}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, _GONE):
        raise OSError("the links could not be made mount points in the sandbox")


def _hold_in(pid: int, paths: tuple[str, ...]) -> None:
    """In the forked child: into ``pid``'s user namespace (the one that owns its mount
    namespace) and mount namespace, then :func:`hold_links`.  Never in this process's
    own mount namespace: the host's links would become mount points."""
    c = libc()
    mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    ours, theirs = os.stat("/proc/self/ns/mnt"), os.fstat(mnt)
    if (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino):
        raise OSError(f"process {pid} is not in a mount namespace of the sandbox's own")
    # The user namespace that owns the mount namespace (bwrap may run the command in a
    # nested one, whose capabilities do not reach the mounts): NS_GET_USERNS.
    user = c.ioctl(mnt, _NS_GET_USERNS)
    if user < 0:
        fail("ioctl(NS_GET_USERNS)")
    if os.fstat(user).st_ino != os.stat("/proc/self/ns/user").st_ino and (
        c.setns(user, _CLONE_NEWUSER) != 0
    ):
        fail("setns(user)")
    if c.setns(mnt, _CLONE_NEWNS) != 0:
        fail("setns(mnt)")
    hold_links(paths)


def sandbox_process(inner: int, timeout: float) -> int:
    """The first process of the sandbox whose first process is ``inner`` (itself or below
    it) that runs something else than bwrap: by then bwrap has built the sandbox's
    mounts (it execs only after).  OSError on timeout; SandboxGone once ``inner`` has
    exited (a bwrap that failed: never waited for in vain)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(inner):
            raise SandboxGone("the sandbox exited while starting")
        todo = [inner]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                with open(f"/proc/{pid}/comm") as fh:
                    comm = fh.read().strip()
            except (OSError, ValueError):
                continue
            if comm != "bwrap":
                return pid
            todo += kids
        time.sleep(0.001)
    raise OSError("the sandbox did not start in time")


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie, not yet reaped, has)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
