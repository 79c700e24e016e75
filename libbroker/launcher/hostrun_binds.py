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

:attr:`Binds.under` keeps, for the launcher alone, an ``O_PATH`` fd on the
workdir and on each bound ``.git``, taken *before* the binds: a lookup
relative to one stays on the mount beneath, which carries no mark (from the
workdir's, until it enters a bound ``.git``).  The end puts the configs back through
it (:func:`.hostrun_gitconfig.finish`): its opens never wait on the gate's
thread, and the exchange of names with the host's copy in the state dir
works (a rename across mounts is EXDEV).  The gate stays up meanwhile for
every other process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Iterable

from libbroker.launcher import hostrun_bindrecord as record
from libbroker.sandbox.libc import fail, libc
from libbroker.shellquote import quote, shown

_OPEN_TREE, _MOVE_MOUNT, _OPENAT2 = 428, 429, 437
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_EMPTY_PATH = 1, 0x8000, 0x1000
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 1, 2, 4, 8
_F_EMPTY, _T_EMPTY = 0x4, 0x40
_MNT_DETACH = 2
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_UNDER = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
RECORD = record.RECORD


def _bind(source: int, target: int, what: str, *, recursive: bool) -> int:
    """Bind the directory ``source`` (an fd: no path is looked up again) onto ``target``
    (an fd on the place, on the mount beneath); an fd on the new bind, for its mark."""
    c = libc()
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH | (
        _AT_RECURSIVE if recursive else 0)
    tree = c.syscall(_OPEN_TREE, source, b"", flags)
    if tree < 0:
        fail(f"open_tree {what}")
    try:
        if c.syscall(_MOVE_MOUNT, tree, b"", target, b"", _F_EMPTY | _T_EMPTY) != 0:
            fail(f"move_mount {what}")
        return os.open(".", O_DIR, dir_fd=tree)  # the new bind's root
    finally:
        os.close(tree)


def open_beneath(dfd: int, rel: str, flags: int, *, same_mount: bool = False) -> int:
    """``rel`` opened beneath ``dfd`` with no link followed anywhere on the way
    (openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``; ``same_mount``: nor a mount
    crossed): a name the session could change is never followed elsewhere."""
    how = struct.pack("QQQ", flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS
                      | _RESOLVE_NO_MAGICLINKS | (_RESOLVE_NO_XDEV if same_mount else 0))
    fd = libc().syscall(_OPENAT2, dfd, os.fsencode(rel), how, len(how))
    if fd < 0:
        fail(f"openat2 {rel}")
    return int(fd)


def _mounts() -> list[tuple[int, int, str]]:
    """(id, parent id, mount point) of every mount in our namespace, in mount order."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            fields = line.split(b" ")
            point = fields[4].replace(b"\\040", b" ").replace(b"\\011", b"\t")
            point = point.replace(b"\\012", b"\n").replace(b"\\134", b"\\")
            out.append((int(fields[0]), int(fields[1]), os.fsdecode(point)))
    return out


def _mount_ids(path: str, mounts: list[tuple[int, int, str]] | None = None) -> list[int]:
    """The ids of the mounts whose mount point is ``path``, in mount order."""
    return [mid for mid, _, point in (_mounts() if mounts is None else mounts) if point == path]


def _mount_id_of(fd: int) -> int:
    """The id of the mount ``fd`` is on (fdinfo's ``mnt_id``); -1 if it cannot be read (the
    release then takes the newest mount there that was not there before)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
        for line in fh:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    return -1


class Binds:
    """The session's binds (paths absolute); :meth:`make` then :meth:`remove` on every path.

    ``opened``: the gate service's directories, verified by their fds
    (:mod:`.gate_service_dirs`): ``""`` the workdir, each ``.git`` by its relative
    path; the binds are made through them, never by a path looked up again.
    ``hold``: the fds on the binds stay open until :meth:`remove`, which detaches
    each through its fd (wherever the session moved it; no path is looked up).
    """

    def __init__(self, workdir: str, git_dirs: list[str], record_dir: str, *,
                 opened: dict[str, int] | None = None, hold: bool = False) -> None:
        self.workdir = workdir
        self.git_dirs = git_dirs  # relative to the workdir, each named .git
        self.record_dir = record_dir
        self.opened = opened or {}
        self.hold = hold
        self._record: record.Record | None = None
        # (mount point, our mount's id or -1 while being made, the ids there before), in order
        self.made: list[tuple[str, int, list[int]]] = []
        self.mark_fds: list[int] = []  # a directory fd on each bind, for the marks
        # git dir (relative; "" the workdir) -> O_PATH fd on it beneath the binds: the
        # launcher's own way in, unmarked
        self.under: dict[str, int] = {}

    def make(self) -> None:
        """Bind and keep an fd on each bind; OSError (after undoing what was done) if any
        bind fails."""
        mounts = _mounts()  # read once (a read per path cost a millisecond per repository)
        for path in (self.workdir, *(os.path.join(self.workdir, g) for g in self.git_dirs)):
            if _mount_ids(path, mounts):  # another session's gate: two stacked would unbind
                raise OSError(errno.EBUSY, f"{shown(path)} is a mount point already (another "
                              "session's live gate?)")
        self._record = record.Record(self.record_dir)  # locked while we live
        # The workdir's mount as it is now (the service's: its verified fd)
        given = self.opened.get("")
        old = os.dup(given) if given is not None else os.open(self.workdir, O_DIR)
        try:
            self.under[""] = os.open(".", _O_UNDER, dir_fd=old)
            self._intend(self.workdir)
            self._made(_bind(old, old, shown(self.workdir), recursive=True))
            for rel in self.git_dirs:
                path = os.path.join(self.workdir, rel)
                self._intend(path)
                given = self.opened.get(rel)
                target = os.dup(given) if given is not None else open_beneath(old, rel, _O_UNDER)
                try:
                    bound = _bind(target, target, shown(path), recursive=False)
                except BaseException:
                    os.close(target)
                    raise
                self.under[rel] = target
                self._made(bound)
        except BaseException:
            self.remove()
            raise
        finally:
            os.close(old)

    def _intend(self, path: str) -> None:
        """Recorded before the mount: a death right after it still leaves its trace.  Nothing
        was mounted there (make checked): the mount there after it is ours."""
        self.made.append((path, -1, []))
        self._write(self.made[-1])

    def _made(self, fd: int) -> None:
        """``fd``: a directory fd on the new bind (kept for its mark); its mount id."""
        self.mark_fds.append(fd)
        self.made[-1] = (self.made[-1][0], _mount_id_of(fd), [])
        self._write(self.made[-1])

    def _write(self, made: record.Made) -> None:
        assert self._record is not None
        self._record.write(made)

    def marked(self) -> None:
        """The marks are made: their fds are not needed any more (a mark holds its mount),
        unless held for the end's detach."""
        if self.hold:
            return
        self._close_marks()

    def _close_marks(self) -> None:
        for fd in self.mark_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.mark_fds = []

    def remove(self) -> list[str]:
        """Unbind everything made (the workdir's first); the lines of what could not be."""
        held = self.mark_fds if self.hold else []
        lines = _detach_fds(held, self.made) if held else []
        self._close_marks()
        for fd in self.under.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.under = {}
        if not held:  # (held: each detached through its own fd, or said)
            lines = _unbind(self.made)
        self.made = []
        if self._record is not None:  # kept, unlocked, if something stayed mounted
            self._record.close(remove=not lines)
            self._record = None
        return lines


def _detach_fds(fds: list[int], made: list[tuple[str, int, list[int]]]) -> list[str]:
    """Each bind detached through the fd held on it, in order (the workdir's first): the
    very mount, wherever it is now.  EINVAL: not mounted any more (gone with the workdir's,
    on a shared mount)."""
    lines = []
    for fd, (path, _, _) in zip(fds, made, strict=False):
        if libc().umount2(f"/proc/self/fd/{fd}".encode(), _MNT_DETACH) != 0:
            import ctypes

            err = ctypes.get_errno()
            if err != errno.EINVAL:
                lines.append(f"agent-sandbox: could not unbind the live guard's mount on "
                             f"{shown(path)}: {os.strerror(err)}; run: umount -l {quote(path)}")
    return lines


def _unbind(made: list[tuple[str, int, list[int]]]) -> list[str]:
    """Detach each of ours that is still the top mount there (never one that was there
    before, nor one stacked on ours since: that is said instead).

    mountinfo is read once (a read per path cost a quarter of a millisecond each, with
    a ``.git`` bind per repository); a detach takes the mounts below ours with it,
    dropped from what was read by their parent ids.  Each detach waits for an RCU grace
    period (milliseconds on a busy machine): the workdir's first, then the ``.git``
    binds' in a few threads at once.  On a shared mount a detach also propagates (the
    ``.git`` binds' copies, even the binds themselves, go with the workdir's): whatever
    the read no longer matches (a detach that fails, a mount stacked on ours) is decided
    again on a fresh read."""
    mounts = _mounts()
    inside = made[0][0] + "/" if made else "/"
    again: list[tuple[str, int, list[int], int]] = []  # (path, id, before, ours)
    for batch in (made[:1], made[1:]):  # the workdir first: the .git binds lie below it
        todo: list[tuple[str, int, list[int], int]] = []
        for path, mid, before in batch:
            path, now, ours = _where(path, mid, before, mounts, inside)
            if ours not in now:
                continue  # never made, or gone already (a second release)
            (todo if now[-1] == ours else again).append((path, mid, before, ours))
        failed = _detach_each([path for path, *_ in todo])
        again += [entry for entry in todo if entry[0] in failed]
        done = {entry[3] for entry in todo if entry[0] not in failed}
        mounts = _without(mounts, done)
    lines = []
    if again:
        mounts = _mounts()
    for path, mid, before, _ in again:
        path, now, ours = _where(path, mid, before, mounts, inside)
        if ours not in now:
            continue  # gone with another (a propagated detach)
        if now[-1] == ours and not _detach_each([path]):
            mounts = _without(mounts, {ours})
            continue
        why = "another mount lies on it" if now[-1] != ours else "it could not be detached"
        lines.append(f"agent-sandbox: could not unbind the live guard's mount on "
                     f"{shown(path)}: {why}; run: umount -l {quote(path)}")
    return lines


def _where(path: str, mid: int, before: list[int], mounts: list[tuple[int, int, str]],
           inside: str) -> tuple[str, list[int], int]:
    """(where our mount is now, the ids there, ours: -1 if gone).  By its id: a repository
    moved within the workdir while the gate was on took its ``.git`` bind along (a
    directory that holds a mount point may be renamed); a place elsewhere, or not a
    ``.git``, is not believed (an id reused after ours went)."""
    if mid >= 0:
        point = next((p for i, _, p in mounts if i == mid), path)
        if point != path and point.startswith(inside) and point.endswith("/.git"):
            path = point
    now = _mount_ids(path, mounts)
    ours = mid if mid >= 0 else next((i for i in reversed(now) if i not in before), -1)
    return path, now, ours


def _without(mounts: list[tuple[int, int, str]], ids: set[int]) -> list[tuple[int, int, str]]:
    """``mounts`` without ``ids`` and every mount below them."""
    gone: set[int] = set()
    more = set(ids)
    while more:
        gone |= more
        more = {child for child, parent, _ in mounts if parent in gone} - gone
    return [m for m in mounts if m[0] not in gone]


def _detach_each(paths: list[str], threads: int = 8) -> set[str]:
    """``umount2(MNT_DETACH)`` each path, up to ``threads`` at once (each waits for an RCU
    grace period; waits that overlap share it); the paths that failed."""
    import threading

    failed: set[str] = set()
    queue = list(paths)

    def work() -> None:
        while queue:
            try:
                path = queue.pop()
            except IndexError:
                return
            if libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
                failed.add(path)

    workers = [threading.Thread(target=work, name="hostrun-unbind", daemon=True)
               for _ in range(min(threads, len(paths)) - 1)]
    for worker in workers:
        worker.start()
    work()  # this thread too
    for worker in workers:
        worker.join()
    return failed


def release(record_dir: str) -> list[str]:
    """The janitor's unbinding of a dead launcher's binds, from its record."""
    taken = record.take(record_dir, wait=2.0)  # a start's repair may hold it a moment
    if taken is None or taken[0] < 0:
        return []
    fd, made = taken
    lines = _unbind(made)
    if lines:
        os.close(fd)
    else:
        record.drop(record_dir, fd)
    return lines


def repair(session_dirs: Iterable[str]) -> list[str]:
    """Binds of sessions whose launcher and janitor both died (the runtime dirs of this
    user, :func:`.runtime_dir.session_dirs`): unbound, said; a live session's are left,
    and a mount its record names is never touched (a dead record's id reused)."""
    live: set[tuple[str, int]] = set()
    dead: list[tuple[str, int, list[record.Made]]] = []
    for path in session_dirs:
        taken = record.take(path)
        if taken is None:
            continue
        fd, made = taken
        if fd < 0:
            live |= {(p, mid) for p, mid, _ in made}
        else:
            dead.append((path, fd, made))
    lines: list[str] = []
    mounts = _mounts() if dead else []
    for path, fd, made in dead:
        made = [m for m in made if (m[0], m[1]) not in live]
        there = [p for p, mid, _ in made if mid in _mount_ids(p, mounts)]
        failed = _unbind(made)
        if failed:
            os.close(fd)
        else:
            record.drop(path, fd)
        if there:
            lines.append(f"agent-sandbox: a session that died with its janitor left its live "
                         f"guard's mounts on {shown(there[0])}" + (
                             f" and {len(there) - 1} more" if len(there) > 1 else "")
                         + ("; unbound them" if not failed else ""))
        lines += failed
    return lines
