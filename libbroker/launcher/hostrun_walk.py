"""The host-run guard's walk: every git directory and every host-run entry in a workdir.

One pass over the whole tree, inside git directories too (a repository
planted in ``.git/objects/ab/`` or 17 levels below ``.git/modules/`` is a
repository for the host's git run from there), iterative and with bounded
fds (:class:`~.hostrun_fs.Chain`): no depth cap.  It finds

- git directories: every ``.git`` directory, and every directory git would
  accept as one (``HEAD`` with ``objects`` and ``refs``, or with
  ``commondir``: git's ``is_git_directory``, by names alone, which is more
  than git accepts), at any depth;
- gitlinks: every ``.git`` that is not a directory (a ``gitdir:`` file, a link);
- the tree entries of :mod:`libpolicy.hostrun`'s table at any depth (a held
  directory such as ``.vscode/`` is fingerprinted whole, not walked);
- directories it cannot open (``unreadable``): the sweep moves them aside.

At the start it records every directory's inode and ctime with what it
found there (:attr:`Walk.dirs`).  At the end, a directory whose inode and
ctime are unchanged has the same names (a ctime cannot be set back from user
space): its recorded findings are taken without reading it again, so the
sweep costs one ``lstat`` per unchanged directory.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from libbroker.launcher.hostrun_fs import Chain
from libpolicy.hostrun import Entry, Table

# Git's state directories: their ``exec`` lines and scripts run at the next
# ``git rebase --continue``/``git cherry-pick --continue``; held like hooks/.
GIT_STATE = (
    Entry("git-rebase", "rebase-merge/", "git", "git rebase --continue runs its exec lines"),
    Entry("git-rebase", "rebase-apply/", "git", "git am/rebase --continue reads it"),
    Entry("git-sequencer", "sequencer/", "git", "git cherry-pick/revert --continue runs it"),
)
_BARE_MARKS = {"HEAD": 1, "objects": 2, "refs": 4, "commondir": 8}
# Inside a git dir, what the live guard (hostrun_live) does not watch; the walk
# itself goes everywhere.
_GIT_SKIP = frozenset({"objects", "refs", "logs", "lfs", "rr-cache", "info", "branches"})
_LONG = 3000  # a path longer than this is looked up through fds, not as one string


def _is_git_dir(names: set[str]) -> bool:
    """git's own test (is_git_directory), by names: HEAD, objects and refs, or commondir."""
    return "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names)


def git_entries(table: Table) -> tuple[Entry, ...]:
    """The entries held in every git directory: the table's and git's state directories."""
    return (*table.git, *GIT_STATE)


class Walk:
    """One pass over the workdir (see the module doc); ``base``: the start's :attr:`dirs`."""

    def __init__(self, table: Table, base: dict[str, list[Any]] | None = None, *,
                 fix: bool = False) -> None:
        self.table = table
        self.base = base
        self.fix = fix  # at the end: the owner's bits given back before "unreadable"
        self.by_last: dict[str, list[Entry]] = {}
        self.globbed: list[Entry] = []  # entries whose last component is "*suffix"
        for entry in table.tree:
            if entry.suffix:
                self.globbed.append(entry)
            else:
                self.by_last.setdefault(entry.parts[-1], []).append(entry)
        self.suffixes = tuple(e.suffix for e in self.globbed)
        self.held_in_git = frozenset(e.parts[0] for e in git_entries(table) if e.is_dir)
        self.git_dirs: list[tuple[str, int]] = []  # (relpath, inode)
        self.gitlinks: list[str] = []  # .git files and links
        self.found: list[tuple[str, Entry]] = []  # tree entries (relpath, entry)
        self.unreadable: list[str] = []  # directories that could not be read
        # relpath -> [inode, ctime ns, subdirectory names, gitlink names, is a git dir]
        self.dirs: dict[str, list[Any]] = {}

    def run(self, root_fd: int) -> None:
        stack: list[tuple[str, ...]] = [()]
        with Chain(root_fd, fix=self.fix) as chain:
            while stack:
                parts = stack.pop()
                rel = "/".join(parts)
                if self._unchanged(root_fd, chain, parts, rel, stack):
                    continue
                try:
                    fd = chain.fd(parts)
                    st = os.fstat(fd)
                    found = self._read(fd, parts, rel)
                except OSError:
                    self.unreadable.append(rel)
                    continue
                self._take(rel, [st.st_ino, st.st_ctime_ns, *found], stack, parts)

    def _unchanged(self, root_fd: int, chain: Chain, parts: tuple[str, ...], rel: str,
                   stack: list[tuple[str, ...]]) -> bool:
        """Take a directory's findings from the start if its inode and ctime are the same."""
        if self.base is None or rel not in self.base:
            return False
        was = self.base[rel]
        try:
            # Every directory above was verified the same way before this one
            # was reached (nothing of the session is alive): a path lookup
            # goes through exactly the directories an fd walk would.
            if not parts:
                st = os.fstat(root_fd)
            elif len(rel) < _LONG:
                st = os.stat(rel, dir_fd=root_fd, follow_symlinks=False)
            else:
                st = os.stat(parts[-1], dir_fd=chain.fd(parts[:-1]), follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or (st.st_ino, st.st_ctime_ns) != (was[0], was[1]):
            return False
        self._take(rel, was, stack, parts)
        return True

    def _take(self, rel: str, found: list[Any], stack: list[tuple[str, ...]],
              parts: tuple[str, ...]) -> None:
        ino, _, subdirs, gitlinks, is_git = found
        self.dirs[rel] = found
        if is_git:
            self.git_dirs.append((rel, ino))
        for name in gitlinks:
            self.gitlinks.append(f"{rel}/{name}" if rel else name)
        stack.extend((*parts, name) for name in reversed(subdirs))

    def _read(self, fd: int, parts: tuple[str, ...], rel: str) -> list[Any]:
        # The hot loop of the scan: per name, one dict lookup and one d_type
        # test; everything else only for the few names that can matter.
        subdirs, gitlinks = [], []
        marks = 0
        by_last, bare, opted_out = self.by_last, _BARE_MARKS, self.table._opted_out
        suffixes = self.suffixes
        with os.scandir(fd) as it:
            for item in it:
                name = item.name
                if name in bare:
                    marks |= bare[name]
                try:
                    is_dir = item.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = True  # unknown: opened as a directory, unreadable if it is not
                if name == ".git" and not is_dir:
                    gitlinks.append(name)
                if name in by_last or (suffixes and name.endswith(suffixes)):
                    entry = self._tree_entry((*parts, name))
                    child = f"{rel}/{name}" if rel else name
                    if entry is not None and not opted_out(child):
                        self.found.append((child, entry))
                        if entry.is_dir:
                            continue  # a held directory is fingerprinted whole
                if is_dir:
                    subdirs.append(name)
        # The root too may be a git dir: a guard of its own watches a git dir outside
        # the workdir (libbroker.launcher.gitdir_guard).
        is_git = (bool(parts) and parts[-1] == ".git") or bool(
            marks & 1 and (marks & 6 == 6 or marks & 8))
        if is_git:  # its hooks/ and state dirs are held entries, fingerprinted whole
            subdirs = [n for n in subdirs if n not in self.held_in_git]
        subdirs.sort()
        return [subdirs, gitlinks, is_git]

    def _tree_entry(self, parts: tuple[str, ...]) -> Entry | None:
        candidates: list[Entry] = [*self.by_last.get(parts[-1], []), *self.globbed]
        for entry in candidates:
            n = len(entry.parts)
            if len(parts) >= n and entry.matches(parts[-n:]):
                return entry
        return None
