"""The host-run guard's walk: every repository and every host-run entry in a workdir.

One pass over the tree by directory fds (never through a link): ``.git``
directories with the git directories inside them (``modules/**``,
``worktrees/*``), bare repositories under any name, and the tree entries of
:mod:`libpolicy.hostrun`'s table at any depth.
"""

from __future__ import annotations

import os

from libbroker.launcher.hostrun_fingerprint import O_DIR, join
from libpolicy.hostrun import NESTED_GIT, Entry, Table

MAX_DEPTH = 256  # directory levels walked (a deeper planted tree is reported, not walked)
_GIT_SKIP = frozenset({"objects", "refs", "logs", "lfs", "rr-cache", "info", "branches"})
_BARE_MARKS = {"HEAD": 1, "objects": 2, "refs": 4, "commondir": 8}


def _is_git_dir(names: set[str]) -> bool:
    """git's own test (is_git_directory): HEAD, objects and refs, or a worktree's commondir."""
    return "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names)


class Walk:
    """One pass over the workdir: every repository and every tree entry, by directory fds."""

    def __init__(self, table: Table, *, inodes: bool = False) -> None:
        self.table = table
        self.inodes = inodes  # keep every directory's inode (to find a renamed .git)
        self.by_last: dict[str, list[Entry]] = {}
        for entry in table.tree:
            self.by_last.setdefault(entry.parts[-1], []).append(entry)
        self.git_dirs: list[tuple[str, int]] = []  # (relpath, inode; 0 for a bare one)
        self.found: list[tuple[str, Entry]] = []  # tree entries (relpath, entry)
        self.dirs_by_ino: dict[tuple[int, int], str] = {}  # for finding a renamed .git
        self.too_deep: list[str] = []  # directories not walked: MAX_DEPTH reached

    def close(self) -> None:
        """Nothing is held between calls; kept so callers need not know."""

    def run(self, root_fd: int) -> None:
        self._dir(root_fd, "", ())

    def _tree_entry(self, parts: tuple[str, ...]) -> Entry | None:
        for entry in self.by_last.get(parts[-1], ()):
            n = len(entry.parts)
            if parts[-n:] == entry.parts:
                return entry
        return None

    def _dir(self, dfd: int, rel: str, parts: tuple[str, ...]) -> None:
        # The hot loop of the scan (100k files in ~5k directories): per file,
        # one set lookup and one d_type test; everything else only for the
        # few names that can matter.
        if len(parts) >= MAX_DEPTH:
            self.too_deep.append(rel)
            return
        subdirs = []
        marks = 0
        by_last, bare = self.by_last, _BARE_MARKS
        with os.scandir(dfd) as it:
            for item in it:
                name = item.name
                if name in bare:
                    marks |= bare[name]
                if name in by_last or name == ".git":
                    try:
                        is_dir = item.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    if name == ".git" and is_dir:
                        # (a .git file or link is a tree entry, git-dir, below)
                        self._git_dir(dfd, join(rel, name), name, item.inode())
                    entry = self._tree_entry((*parts, name))
                    if entry is not None and not self.table._opted_out(join(rel, name)):
                        self.found.append((join(rel, name), entry))
                        continue  # a held directory is fingerprinted whole
                    if is_dir and name != ".git":
                        subdirs.append((name, item.inode()))
                elif item.is_dir(follow_symlinks=False):
                    subdirs.append((name, item.inode()))
        if marks & 1 and (marks & 6 == 6 or marks & 8):
            # a bare repository (HEAD, objects, refs) or a worktree's git dir, under any
            # name; the root itself when the guard watches a git dir outside the workdir
            # (libbroker.launcher.gitdir_guard)
            self.git_dirs.append((rel, 0))
            subdirs = [(n, i) for n, i in subdirs if n not in _GIT_SKIP and n != "hooks"]
        for name, ino in subdirs:
            try:
                fd = os.open(name, O_DIR, dir_fd=dfd)
            except OSError:
                continue
            try:
                child = join(rel, name)
                if self.inodes:
                    self.dirs_by_ino[(os.fstat(fd).st_dev, ino)] = child
                self._dir(fd, child, (*parts, name))
            finally:
                os.close(fd)

    def _git_dir(self, dfd: int, rel: str, name: str, ino: int) -> None:
        """A git directory and the git directories inside it (modules/**, worktrees/*)."""
        self.git_dirs.append((rel, ino))
        try:
            fd = os.open(name, O_DIR, dir_fd=dfd)
        except OSError:
            return
        try:
            for nested in NESTED_GIT:
                try:
                    nfd = os.open(nested, O_DIR, dir_fd=fd)
                except OSError:
                    continue
                try:
                    self._nested(nfd, join(rel, nested), 0)
                finally:
                    os.close(nfd)
        finally:
            os.close(fd)

    def _nested(self, dfd: int, rel: str, depth: int) -> None:
        """Find git dirs under modules/ (names may hold '/') and worktrees/."""
        if depth > 16:
            return
        for item in os.scandir(dfd):
            if not item.is_dir(follow_symlinks=False):
                continue
            try:
                fd = os.open(item.name, O_DIR, dir_fd=dfd)
            except OSError:
                continue
            try:
                names = set(os.listdir(fd))
                child = join(rel, item.name)
                if _is_git_dir(names):
                    self._git_dir(dfd, child, item.name, item.inode())
                else:
                    self._nested(fd, child, depth + 1)
            finally:
                os.close(fd)
