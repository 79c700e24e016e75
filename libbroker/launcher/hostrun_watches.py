"""The live guard's inotify watches over a workdir: which directories, and what in them.

Every directory of the workdir is watched, but inside a git directory only
the directory itself, ``hooks/``, ``modules/`` and ``worktrees/`` (never
objects or refs, which git writes all the time).  :class:`Watches` walks and
adds them; :class:`.hostrun_live.Watcher` judges the events.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable

from libbroker.launcher import inotify
from libbroker.launcher.hostrun_fingerprint import Snapshot
from libbroker.launcher.hostrun_walk import _GIT_SKIP as GIT_SKIP
from libbroker.launcher.hostrun_walk import _is_git_dir as is_git_dir
from libpolicy.hostrun import NESTED_GIT

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MASK = (inotify.CREATE | inotify.MOVED_TO | inotify.MOVED_FROM | inotify.DELETE
        | inotify.MODIFY | inotify.CLOSE_WRITE | inotify.ATTRIB | inotify.DELETE_SELF
        | inotify.MOVE_SELF | inotify.EXCL_UNLINK)
GIT_MARKS = frozenset({"HEAD", "objects", "refs", "commondir"})  # a directory may turn git dir


class Watches:
    """The watched directories of one workdir (``dirs``: wd -> (relpath, kind))."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.table = snap.table
        self.names = self.table.first_names | {".git"} | GIT_MARKS
        self.git_names = frozenset(e.parts[0] for e in self.table.git) | set(NESTED_GIT)
        self.dirs: dict[int, tuple[str, str]] = {}  # wd -> (relpath, "tree" | "git" | "inside")
        self.git_dirs: set[str] = set(snap.repos)
        self.unwatched = 0
        self._pending: dict[str, None] = {}  # paths to judge at the end of the batch
        # For the end sweep's walk (quiet): the watches of the walk before go, and every
        # watch an event named.
        self._initial: dict[int, tuple[str, str]] = {}
        self._touched: set[int] = set()
        self._ino = inotify.Inotify()
        self._root = os.open(snap.workdir, O_DIR)
        self._ready = threading.Event()  # every directory watched
        self.busy = False  # reading or judging a batch (the gate waits for it: synced())
        self.on_batch: Callable[[], None] | None = None  # the gate's wake-up
        self._stopped = False
        self._closer: threading.Thread | None = None
        self._inside: dict[str, str] = {}  # an "inside" watch's rel -> its path

    def synced(self) -> bool:
        """Whether every change queued so far has been judged (the gate asks)."""
        if self._stopped:
            return True
        if not self._ready.is_set() or self.busy:
            return False
        pending = select.poll()
        pending.register(self._ino.fd, select.POLLIN)
        return not pending.poll(0) and not self.busy

    def _watch_path(self, path: str, rel: str) -> None:
        fd = os.open(path, O_DIR)
        try:
            self.dirs[self._ino.add(fd, MASK)] = (rel, "inside")
            self._inside[rel] = path
        finally:
            os.close(fd)

    def _watch_tree(self, top: int, top_rel: str, *, judge: bool) -> None:
        """Watch ``top`` and every directory below; ``judge``: a tree that appeared in the
        session, whose host-run entries are judged as found.

        Iterative, depth first, and a directory's fd stays open only while children of
        it wait (a shared count): the fds held follow the depth, not the width (a
        node_modules/ of 10k entries).  A directory that cannot be opened or watched
        (EMFILE a thousand levels down, EACCES, the watch limit) is counted, and said.
        """
        stack: list[tuple[list[int], str, str]] = [([os.dup(top), 1], "", top_rel)]
        while stack:
            parent, name, rel = stack.pop()
            try:
                fd = os.open(name, O_DIR, dir_fd=parent[0]) if name else os.dup(parent[0])
            except OSError:
                fd = -1
                self.unwatched += 1
            finally:
                parent[1] -= 1
                if parent[1] == 0:
                    os.close(parent[0])
            if fd < 0:
                continue
            subdirs = self._watch_one(fd, rel, judge=judge)
            if not subdirs:
                os.close(fd)
                continue
            ref = [fd, len(subdirs)]
            stack += [(ref, sub, join(rel, sub)) for sub in subdirs]

    def _watch_one(self, fd: int, rel: str, *, judge: bool) -> list[str]:
        """Watch the directory ``fd``; the subdirectories of it to watch too."""
        kind = self._kind(rel)
        try:
            self.dirs[self._ino.add(fd, MASK)] = (rel, kind)
            with os.scandir(fd) as it:  # d_type: no open() tried on a file
                items = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            self.unwatched += 1
            return []
        names = [name for name, _ in items]
        if judge:  # judged once the batch is read (_drain), each entry once
            for name in names:
                if self._relevant(rel, kind, name):
                    self._pending[join(rel, name)] = None
        subdirs = {name for name, is_dir in items if is_dir}
        return [name for name in self._descend(rel, kind, names) if name in subdirs]

    def _kind(self, rel: str) -> str:
        if rel in self.git_dirs or rel.endswith("/.git") or rel == ".git":
            return "git"
        return "tree"

    def _descend(self, rel: str, kind: str, names: list[str]) -> list[str]:
        """The subdirectories worth watching: in a git dir only hooks, modules, worktrees."""
        if kind == "git":
            return [n for n in names if n in ("hooks", *NESTED_GIT)]
        if GIT_MARKS & set(names) >= {"HEAD"} and is_git_dir(set(names)):
            self.git_dirs.add(rel)  # a bare repository: as a git dir
            return [n for n in names if n in ("hooks", *NESTED_GIT)]
        skip = GIT_SKIP if "/.git/" in f"/{rel}/" else ()
        return [n for n in names if n not in skip]

    def _relevant(self, dir_rel: str, kind: str, name: str) -> bool:
        if kind == "git":
            return name in self.git_names
        if name in self.names or "/.git/" in f"/{dir_rel}/" or dir_rel in self.git_dirs:
            return True  # a hook, or something inside modules/ worktrees/
        return self.table.match(join(dir_rel, name)) is not None or self._in_git(dir_rel)

    def _in_git(self, dir_rel: str) -> bool:
        """Whether ``dir_rel`` lies in a git dir (a bare one's hooks/, say)."""
        return self._git_dir_of(dir_rel) is not None

    # --- the loop -----------------------------------------------------------------

    def _git_dir_of(self, path: str) -> str | None:
        """The git dir ``path`` lies in (or is), by the names on its way; None outside one."""
        parts = path.split("/")
        for i in range(len(parts), 0, -1):
            head = "/".join(parts[:i])
            if head in self.git_dirs:
                return head
        return None

    def _recorded_above(self, path: str) -> str | None:
        parts = path.split("/")
        for i in range(len(parts), 0, -1):
            head = "/".join(parts[:i])
            if head in self.snap.entries and head not in self.snap.repos:
                return head
        return None


    # --- the end ------------------------------------------------------------------

    def drain_queue(self) -> int:
        """Take in the events still queued when the loop stopped (nothing of the session is
        alive: the queue is complete; the end sweep judges their entries); the overflows."""
        lost = 0
        with contextlib.suppress(OSError):
            while events := self._ino.read():
                self._touched.update(ev.wd for ev in events)
                lost += sum(1 for ev in events if ev.mask & inotify.Q_OVERFLOW)
        return lost

    def quiet(self) -> frozenset[str]:
        """The workdir's directories (relative) watched from go that no event named: the
        same names as at the start, and not chmodded, moved or removed themselves (inotify
        reports each on the directory's own watch).  The end sweep's walk takes their
        findings from the start without an ``lstat`` where every directory above is quiet
        too (hostrun_walk)."""
        touched = {self._initial[wd][0] for wd in self._touched if wd in self._initial}
        return frozenset(rel for wd, (rel, kind) in self._initial.items()
                         if kind != "inside" and wd not in self._touched and rel not in touched)


    def close_group(self) -> None:
        """Close the inotify group in a thread of its own, while the configs go back and
        the sweep runs (dropping 5k watches took 7 to 18 ms); :meth:`closed` joins it."""
        if self._closer is not None:
            return
        self._closer = threading.Thread(target=self._ino.close, name="hostrun-live-close",
                                        daemon=True)
        self._closer.start()

    def watched(self) -> list[str]:
        """The watched directories' paths (as when watched: one moved since names another,
        or none)."""
        top = self.snap.workdir
        return [self._inside.get(rel) or (os.path.join(top, rel) if rel else top)
                for rel, _ in self.dirs.values()]

    def closed(self) -> None:
        """Wait for :meth:`close_group`'s end."""
        if self._closer is not None:
            self._closer.join()
            self._closer = None

    def unwritten(self) -> frozenset[str]:
        """The repositories' configs (relative) whose private copy's directory no event
        named: the session never wrote there (the end's last merge has nothing to take)."""
        return frozenset(rel.removeprefix("inside:") for wd, (rel, kind) in self.dirs.items()
                         if kind == "inside" and wd not in self._touched)


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
