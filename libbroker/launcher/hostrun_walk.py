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


def _dir_or_unknown(item: os.DirEntry[str]) -> bool:
    try:
        return item.is_dir(follow_symlinks=False)
    except OSError:
        return True


def git_entries(table: Table) -> tuple[Entry, ...]:
    """The entries held in every git directory: the table's and git's state directories."""
    return (*table.git, *GIT_STATE)


class Walk:
    """One pass over the workdir (see the module doc); ``base``: the start's :attr:`dirs`."""

    def __init__(self, table: Table, base: dict[str, list[Any]] | None = None, *,
                 fix: bool = False, quiet: frozenset[str] | None = None) -> None:
        self.table = table
        self.base = base
        # Directories the live guard saw no event on (Watcher.quiet_dirs): taken from the
        # start without an lstat, where the directory above was taken unchanged too.
        self.quiet = quiet or frozenset()
        self._same: set[str] = set()  # the directories taken unchanged in this walk
        self.fix = fix  # at the end: the owner's bits given back before "unreadable"
        self.by_last: dict[str, list[Entry]] = {}
        self.globbed: list[Entry] = []  # entries whose last component is "*suffix"
        for entry in table.tree:
            if entry.suffix:
                self.globbed.append(entry)
            else:
                self.by_last.setdefault(entry.parts[-1], []).append(entry)
        self.suffixes = tuple(e.suffix for e in self.globbed)
        # the names _read looks at one by one: entries' last names, git's marks, .git
        self.interesting = frozenset(self.by_last) | frozenset(_BARE_MARKS) | {".git"}
        self.held_in_git = frozenset(e.parts[0] for e in git_entries(table) if e.is_dir)
        self.git_dirs: list[tuple[str, int]] = []  # (relpath, inode)
        self.gitlinks: list[str] = []  # .git files and links
        self.found: list[tuple[str, Entry]] = []  # tree entries (relpath, entry)
        self.unreadable: list[str] = []  # directories that could not be read
        # relpath -> [inode, ctime ns, subdirectory names, gitlink names, is a git dir]
        self.dirs: dict[str, list[Any]] = {}

    def run(self, root_fd: int) -> None:
        stack: list[tuple[str, ...]] = self._quiet_part() if self.quiet else [()]
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

    def _quiet_part(self) -> list[tuple[str, ...]]:
        """Take at once what the live guard proves unchanged; the directories left to walk.

        A directory is proven when it and every directory above it are quiet (no event
        named any of them: each has the names it had at the start, so each name below
        leads where it led).  The others (not watched: inside git dirs; or named by an
        event) are the *tops* of the rest: the usual walk starts at each, in which a quiet
        directory below one counts only once the one above it was found unchanged.
        Only what the start found in proven directories is taken over: the git dirs and
        gitlinks (new entries cannot be in them), without a look at each directory.
        """
        assert self.base is not None
        base, quiet = self.base, self.quiet
        rest = base.keys() - quiet
        tops = set()
        for rel in rest:
            up, above = rel, False
            while up:
                up = up.rpartition("/")[0]
                if up in rest:
                    above = True
                    break
            if not above:
                tops.add(rel)
        if "" in tops:
            return [()]

        def proven(rel: str) -> bool:
            while rel:
                if rel in tops:
                    return False
                rel = rel.rpartition("/")[0]
            return True

        for rel, (ino, _, _, gitlinks, is_git) in self._findings().items():
            if proven(rel):
                if is_git:
                    self.git_dirs.append((rel, ino))
                self.gitlinks += [f"{rel}/{name}" if rel else name for name in gitlinks]
        return sorted((tuple(rel.split("/")) for rel in tops), reverse=True)

    def _findings(self) -> dict[str, list[Any]]:
        """The start's directories that held a git dir or a gitlink (few of thousands)."""
        assert self.base is not None
        return {rel: found for rel, found in self.base.items() if found[3] or found[4]}

    def _unchanged(self, root_fd: int, chain: Chain, parts: tuple[str, ...], rel: str,
                   stack: list[tuple[str, ...]]) -> bool:
        """Take a directory's findings from the start if its inode and ctime are the same."""
        if self.base is None or rel not in self.base:
            return False
        was = self.base[rel]
        if rel in self.quiet and (not parts or rel.rpartition("/")[0] in self._same):
            self._same.add(rel)
            self._take(rel, was, stack, parts)
            return True
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
        self._same.add(rel)
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
        # The hot loop of the scan (100k names): comprehensions and one set intersection
        # in C; a name is looked at in Python only when it can matter.
        with os.scandir(fd) as it:
            items = list(it)
        try:
            subdirs = [item.name for item in items if item.is_dir(follow_symlinks=False)]
        except OSError:  # d_type unknown and lstat failed: opened as a directory, later
            subdirs = [item.name for item in items if _dir_or_unknown(item)]
        names = [item.name for item in items]
        hits = self.interesting.intersection(names)
        if self.suffixes:
            hits = hits.union([name for name in names if name.endswith(self.suffixes)])
        gitlinks, marks = [], 0
        for name in sorted(hits):
            marks |= _BARE_MARKS.get(name, 0)
            if name == ".git" and name not in subdirs:
                gitlinks.append(name)
            if name in self.by_last or (self.suffixes and name.endswith(self.suffixes)):
                entry = self._tree_entry((*parts, name))
                child = f"{rel}/{name}" if rel else name
                if entry is not None and not self.table._opted_out(child):
                    self.found.append((child, entry))
                    if entry.is_dir and name in subdirs:
                        subdirs.remove(name)  # a held directory is fingerprinted whole
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
