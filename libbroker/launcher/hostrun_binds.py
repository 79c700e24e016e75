"""The workdir bound onto itself in the host's mount namespace, for the gate's fanotify marks.

A fanotify mount mark sees every open made *through that mount object*.
The sandbox's view of the workdir is a different object (bwrap's bind, or the
copy the Landlock helper's mount namespace made), so a mark on a bind made
here, in the host's namespace, sees the host's processes only, and costs the
session's own work nothing.  Two kinds of binds, made before the sandbox
starts:

- the workdir onto itself (recursive: mounts below it stay visible): every
  path lookup that starts above the workdir (``git -C dir``, git's own
  discovery, which works with absolute paths, a new terminal's ``cd``) lands
  on it;
- each repository's ``.git`` directory onto itself, attached on the mount the
  workdir was on *before* (through a directory fd taken first): a shell whose
  working directory predates the session still holds the old mount, and
  git at the top of a worktree opens ``.git/...`` relative to it.

Unbound in the reverse order (the workdir's first: the ``.git`` binds lie
below it) on every exit path: :meth:`Binds.remove` at the end, and from the
record written *before* each mount (in the session's runtime dir, which
outlives the gate), :func:`release` for the janitor.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

from libbroker.sandbox.libc import fail, libc
from libbroker.shellquote import quote, shown

_OPEN_TREE, _MOVE_MOUNT = 428, 429
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_FDCWD = 1, 0x8000, -100
_F_EMPTY, _T_EMPTY = 0x4, 0x40
_MNT_DETACH = 2
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
RECORD = "binds.json"


def _bind(src: str, target_fd: int | None, target: str, *, recursive: bool) -> None:
    c = libc()
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    tree = c.syscall(_OPEN_TREE, _AT_FDCWD, os.fsencode(src), flags)
    if tree < 0:
        fail(f"open_tree {src}")
    try:
        if target_fd is None:
            done = c.syscall(_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _F_EMPTY)
        else:
            done = c.syscall(_MOVE_MOUNT, tree, b"", target_fd, b"", _F_EMPTY | _T_EMPTY)
        if done != 0:
            fail(f"move_mount {target}")
    finally:
        os.close(tree)


def _mount_ids(path: str) -> list[int]:
    """The ids of the mounts whose mount point is ``path``, in mount order."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            fields = line.split(b" ")
            point = fields[4].replace(b"\\040", b" ").replace(b"\\011", b"\t")
            point = point.replace(b"\\012", b"\n").replace(b"\\134", b"\\")
            if os.fsdecode(point) == path:
                out.append(int(fields[0]))
    return out


class Binds:
    """The session's binds (paths absolute); :meth:`make` then :meth:`remove` on every path."""

    def __init__(self, workdir: str, git_dirs: list[str], record_dir: str) -> None:
        self.workdir = workdir
        self.git_dirs = git_dirs  # relative to the workdir, each named .git
        self.record = os.path.join(record_dir, RECORD)
        # (mount point, our mount's id or -1 while being made, the ids there before), in order
        self.made: list[tuple[str, int, list[int]]] = []
        self.mark_fds: list[int] = []  # a directory fd on each bind, for the marks

    def make(self) -> None:
        """Bind and keep an fd on each bind; OSError (after undoing what was done) if any
        bind fails."""
        for path in (self.workdir, *(os.path.join(self.workdir, g) for g in self.git_dirs)):
            if _mount_ids(path):  # another session's gate: two stacked would unbind wrongly
                raise OSError(errno.EBUSY, f"{shown(path)} is a mount point already (another "
                              "session's live gate?)")
        old = os.open(self.workdir, O_DIR)  # the workdir's mount as it is now
        try:
            self._intend(self.workdir)
            _bind(self.workdir, None, self.workdir, recursive=True)
            self._made(self.workdir)
            self.mark_fds.append(os.open(self.workdir, O_DIR))
            for rel in self.git_dirs:
                path = os.path.join(self.workdir, rel)
                self._intend(path)
                target = os.open(rel, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                                 dir_fd=old)
                try:
                    _bind(path, target, path, recursive=False)
                finally:
                    os.close(target)
                self._made(path)
                self.mark_fds.append(os.open(rel, O_DIR, dir_fd=old))  # crosses onto the bind
        except BaseException:
            self.remove()
            raise
        finally:
            os.close(old)

    def _intend(self, path: str) -> None:
        """Recorded before the mount: a death right after it still leaves its trace."""
        self.made.append((path, -1, _mount_ids(path)))
        self._write()

    def _made(self, path: str) -> None:
        before = self.made[-1][2]
        new = [i for i in _mount_ids(path) if i not in before]
        self.made[-1] = (path, new[-1] if new else -1, before)
        self._write()

    def _write(self) -> None:
        tmp = self.record + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"made": self.made}, fh)
        os.rename(tmp, self.record)

    def remove(self) -> list[str]:
        """Unbind everything made (the workdir's first); the lines of what could not be."""
        for fd in self.mark_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.mark_fds = []
        lines = _unbind(self.made)
        self.made = []
        if not lines:
            with contextlib.suppress(OSError):
                os.unlink(self.record)
        return lines


def _unbind(made: list[tuple[str, int, list[int]]]) -> list[str]:
    """Detach each of ours that is still the top mount there (never one that was there
    before, nor one stacked on ours since: that is said instead)."""
    import ctypes

    lines = []
    for path, mid, before in made:  # the workdir first: the .git binds are reachable only then
        now = _mount_ids(path)
        ours = mid if mid >= 0 else next((i for i in reversed(now) if i not in before), -1)
        if ours not in now:
            continue  # never made, or gone already (a second release)
        if now[-1] != ours or libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
            why = "another mount lies on it" if now[-1] != ours else os.strerror(ctypes.get_errno())
            lines.append(f"agent-sandbox: could not unbind the live guard's mount on "
                         f"{shown(path)}: {why}; run: umount -l {quote(path)}")
    return lines


def release(record_dir: str) -> list[str]:
    """The janitor's (or a later start's) unbinding of a dead session's binds, from its record."""
    path = os.path.join(record_dir, RECORD)
    try:
        with open(path) as fh:
            data = json.load(fh)
        made = [(str(p), int(i), [int(b) for b in before])
                for p, i, before in data.get("made", [])]
    except (OSError, ValueError, TypeError):
        return []
    lines = _unbind(made)
    if not lines:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return lines
