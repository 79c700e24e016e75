"""The sweep's shortcut for entries the kernel shows unchanged: one ``lstat`` by path.

The sweep's careful check of an entry (:meth:`.hostrun_sweep.Sweeper.check`)
opens every directory on its way from the root by fd, ``O_NOFOLLOW``: a
link the session put in place of a directory above the entry is found and
moved aside.  That costs an ``open`` per level and entry, most of the end's
time on a tree of 50 repositories.  :class:`SameByPath` answers first, and
only ever "unchanged" (False sends the entry to the careful check):

- every directory above the entry must be proven the same as at the start:
  quiet (no live-guard event named it, hostrun_watches) or, by ``lstat``, a
  directory with the inode and ctime the scan recorded; each one in turn
  from the root, so a path from the root runs through exactly the
  directories the scan saw (a changed name changes its directory's ctime,
  which user space cannot set back), never through a planted link;
- then the entry itself, by ``lstat``, must be what the scan recorded:
  device, inode, size, mtime, ctime and mode (the careful check's own test
  for "unchanged" without reading bytes); a held directory (``hooks/``) by
  its own stat, which proves its names, and each recorded entry in it the
  same way.  An entry missing at the start must still be missing.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from libbroker.launcher.hostrun_fingerprint import Node


class SameByPath:
    """The shortcut over one workdir (``root``: its fd; ``dirs``: the scan's directories,
    relpath -> [inode, ctime, ...]; ``quiet``: the live guard's quiet directories)."""

    def __init__(self, root: int, dirs: dict[str, list[Any]],
                 quiet: frozenset[str] | None) -> None:
        self.root = root
        self.dirs = dirs
        self.quiet = quiet or frozenset()
        self.dev = os.fstat(root).st_dev
        self._same: dict[str, bool] = {"": True}  # the root: the fd itself

    def unchanged(self, rel: str, recorded: Node | None) -> bool:
        """True only when ``rel`` is provably its recorded self; False: look closely."""
        if not self._dir_same(rel.rpartition("/")[0]):
            return False
        try:
            st = os.stat(rel, dir_fd=self.root, follow_symlinks=False)
        except FileNotFoundError:
            return recorded is None
        except OSError:
            return False
        if recorded is None or not self._same_node(recorded, st):
            return False
        stack = [(rel, recorded)]
        while stack:  # a held directory: its stat proved its names; each entry in it now
            path, node = stack.pop()
            for name, child in (node.children or {}).items():
                sub = f"{path}/{name}"
                try:
                    cst = os.stat(sub, dir_fd=self.root, follow_symlinks=False)
                except OSError:
                    return False
                if not self._same_node(child, cst):
                    return False
                if child.kind == "dir":
                    stack.append((sub, child))
        return True

    def _same_node(self, node: Node, st: os.stat_result) -> bool:
        return st.st_dev == self.dev and node.same_stat(st)

    def _dir_same(self, rel: str) -> bool:
        """Whether the directory ``rel`` and every one above it are the scan's, unchanged."""
        todo = []
        while rel not in self._same:
            todo.append(rel)
            rel = rel.rpartition("/")[0]
        ok = self._same[rel]
        for rel in reversed(todo):  # from the top down: each lookup through proven ones
            ok = ok and (rel in self.quiet or self._stat_same(rel))
            self._same[rel] = ok
        return ok

    def _stat_same(self, rel: str) -> bool:
        was = self.dirs.get(rel)
        if was is None:
            return False
        try:
            st = os.stat(rel, dir_fd=self.root, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and (st.st_ino, st.st_ctime_ns) == (was[0], was[1])
