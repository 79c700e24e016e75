"""The host-run guard's sweep, at session end: every host-run entry back to its snapshot.

:func:`sweep` (every exit path, the janitor's included) restores each entry
that changed to its recorded state and moves the session's version aside
under ``$XDG_STATE_HOME/agent-sandbox/quarantine/<session>/`` (nothing of
the agent's is deleted); an entry that appeared is moved aside.  Git
directories that appeared, gitlinks and commondirs are left to
:mod:`.hostrun_newrepo`.  One line per entry names it and, where there is
one, the command that applies the session's version after all.

Fail closed: whatever the sweep cannot open, read, hash or bound is moved
aside whole, with one line (as the owner, it first gives itself back the
bits the agent took away); an error never counts as "unchanged".  The saved
copies of the originals are removed only after a sweep that restored
everything; otherwise the last line names where they are.

The sweep walks a tree the agent controlled, so it never follows a link:
every lookup is one name relative to a directory fd (``O_NOFOLLOW``), each
file is judged by what its open fd says, moves are ``renameat`` (which moves
a link, never its target), and restores write a temporary file beside the
entry and rename it into place.  A link where an entry (or a directory above
one) was is itself a change: it is moved aside and the recorded entry
written in its place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable

from libbroker.launcher.hostrun_fingerprint import Looker, Node, Snapshot
from libbroker.launcher.hostrun_fs import (
    O_DIR,
    O_NEW,
    Chain,
    clone_into,
    copy_tree,
    give_owner,
    make_dirs,
    parent_of,
    remove_path,
    remove_tree,
)
from libbroker.launcher.hostrun_newrepo import check_new_repo, judge_pointers
from libbroker.launcher.hostrun_same import SameByPath
from libbroker.launcher.hostrun_scan import quarantine_dir
from libbroker.launcher.hostrun_walk import Walk
from libbroker.shellquote import command, quote, shown


def state_dir(home: str = "") -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        home or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-sandbox")


MOVE_TRIES = 5  # a quarantine name taken meanwhile by the other mover: found anew

class Sweeper:
    def __init__(self, snap: Snapshot, state: str, *, copy_only: bool = False) -> None:
        self.snap = snap
        self.quarantine = quarantine_dir(state, snap.session)
        self.qfd = -1
        self.lines: list[str] = []
        self.failed = False  # an entry neither checked nor moved aside: originals are kept
        self.copy_only = copy_only  # tests: the quarantine on another filesystem
        self.looker = Looker(snap, fix=True)

    # -- moving aside
    def _qdir(self, rel: str) -> tuple[int, str, str]:
        """The quarantine directory fd for ``rel`` (created), a free name in it, and that
        name's path.  A directory on the way that is already something else there (a link
        moved aside earlier by that name) is made beside it as ``name.N``."""
        if self.qfd < 0:
            os.makedirs(self.quarantine, mode=0o700, exist_ok=True)
            self.qfd = os.open(self.quarantine, O_DIR)
        parts = rel.split("/")
        fd, path = make_dirs(self.qfd, self.quarantine, parts[:-1])
        name, n = parts[-1], 0
        while True:
            try:
                os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return fd, name, os.path.join(path, name)
            n += 1
            name = f"{parts[-1]}.{n}"

    def move_aside(self, pfd: int, name: str, rel: str) -> str:
        """Move ``name`` (whatever it is; a link stays a link) into the quarantine.

        The free name :meth:`_qdir` found can be taken before the rename by the other
        thread that moves things aside (the live watcher's and its backlog's): a rename
        onto it fails (EEXIST, ENOTEMPTY), and a fresh free name is found.
        """
        for _ in range(MOVE_TRIES - 1):
            try:
                return self._move_aside(pfd, name, rel)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        return self._move_aside(pfd, name, rel)

    def _move_aside(self, pfd: int, name: str, rel: str) -> str:
        qfd, qname, where = self._qdir(rel)
        try:
            try:
                self._rename(pfd, name, qfd, qname)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # Another filesystem: off its path first (one rename: what a live
                # session still writes by that path is not in the copy, and not lost),
                # then copied, then removed.
                staged = _stage(pfd, name)
                copy_tree(pfd, staged, qfd, qname)
                remove_tree(pfd, staged)
        finally:
            os.close(qfd)
        return where

    def _rename(self, pfd: int, name: str, qfd: int, qname: str) -> None:
        if self.copy_only:
            raise OSError(errno.EXDEV, "forced copy")
        try:
            os.rename(name, qname, src_dir_fd=pfd, dst_dir_fd=qfd)
        except PermissionError:  # the agent's chmod on the parent, or on a directory moved
            st = os.fstat(pfd)
            if st.st_uid == os.geteuid():
                os.fchmod(pfd, stat.S_IMODE(st.st_mode) | 0o700)
            give_owner(pfd, name, 0o700)
            os.rename(name, qname, src_dir_fd=pfd, dst_dir_fd=qfd)

    def exists(self, dfd: int, name: str) -> bool:
        try:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def aside(self, dfd: int, name: str, rel: str, rule: str, why: str,
              replace: Node | None = None) -> None:
        """Move ``name`` aside with one line; write ``replace`` in its place when given."""
        q = self.move_aside(dfd, name, rel)
        path = os.path.join(self.snap.workdir, rel)
        if replace is not None:
            self.materialize(dfd, name, replace)
            self.say(rel, rule, f"{why}; the whole file moved to {quote(q)}",
                     command("mv", "-f", "-T", "--", q, path))
        else:
            self.say(rel, rule, f"{why}; moved to {quote(q)}", command("mv", "-T", "--", q, path))

    # -- writing back
    def materialize(self, pfd: int, name: str, node: Node) -> None:
        """Write the recorded ``node`` as ``name`` in ``pfd`` (which holds nothing by that name)."""
        stack: list[tuple[tuple[str, ...], Node]] = [((name,), node)]
        modes: list[tuple[tuple[str, ...], int]] = []
        with Chain(pfd) as chain:
            while stack:
                parts, rec = stack.pop()
                dfd = chain.fd(parts[:-1])
                if rec.kind == "link":
                    os.symlink(rec.link, parts[-1], dir_fd=dfd)
                elif rec.kind == "file":
                    self._write_file(dfd, parts[-1], rec)
                elif rec.kind == "dir":
                    os.mkdir(parts[-1], 0o700, dir_fd=dfd)
                    modes.append((parts, stat.S_IMODE(rec.mode)))
                    stack += [((*parts, c), sub) for c, sub in (rec.children or {}).items()]
            for parts, mode in reversed(modes):  # deepest first: a 0500 dir filled before
                os.chmod(parts[-1], mode, dir_fd=chain.fd(parts[:-1]))

    def _write_file(self, dfd: int, name: str, rec: Node) -> None:
        tmp = f".{name}.agent-sandbox-restore"[:255]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        fd = os.open(tmp, O_NEW, 0o600, dir_fd=dfd)
        try:
            if rec.copy:
                src = self.snap.open_saved(rec)
                try:
                    clone_into(src, fd)
                finally:
                    os.close(src)
            else:
                view = memoryview(self.snap.blobs[rec.digest])
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, stat.S_IMODE(rec.mode))
            if rec.mtime:
                os.utime(fd, ns=(rec.mtime, rec.mtime))
            st = os.fstat(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        # These bytes are the recorded ones: a later sweep (the saved copy gone by then)
        # knows the file by its stat, as the scan's.
        rec.ino, rec.ctime, rec.mtime = st.st_ino, os.stat(
            name, dir_fd=dfd, follow_symlinks=False).st_ctime_ns, st.st_mtime_ns

    def say(self, rel: str, rule: str, what: str, cmd: str = "") -> None:
        line = f"agent-sandbox: {shown(rel)} [{rule}]: {what}"
        if cmd:
            line += f"; to apply the session's version: {cmd}"
        self.lines.append(line)

    # -- one recorded entry
    def check(self, root: int, rel: str, rule: str, recorded: Node | None,
              shared: Chain | None = None) -> None:
        """Bring one entry back to its recorded state (``recorded`` None: it was missing).

        ``shared``: a chain of directory fds the caller keeps from entry to entry (entries
        of one repository share their path); valid only while nothing was moved."""
        parts = rel.split("/")
        with contextlib.nullcontext(shared) if shared else Chain(root, fix=True) as chain:
            for i in range(len(parts) - 1):
                try:
                    chain.fd(tuple(parts[: i + 1]))
                    continue
                except OSError:
                    pass
                self._above(chain.fd(tuple(parts[:i])), parts, i, rule, recorded)
                if recorded is None:
                    return  # nothing was there: nothing can be beneath
            fd, name = chain.fd(tuple(parts[:-1])), parts[-1]
            if recorded is None:
                if self.exists(fd, name):
                    self.restore(rel, rule, None, fd, name)
                return
            if recorded.kind == "dir" and recorded.children is None:
                self._repo_dir(fd, name, rel, rule, recorded)
            elif not self.looker.unchanged(recorded, fd, name):
                self.restore(rel, rule, recorded, fd, name)

    def _above(self, fd: int, parts: list[str], i: int, rule: str, recorded: Node | None) -> None:
        """A directory above an entry that is not one: a link or a file moved aside, the
        directory made again, so that the entry is written, never through it."""
        name = parts[i]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            if recorded is not None:
                os.mkdir(name, 0o755, dir_fd=fd)
            return
        upper = "/".join(parts[: i + 1])
        what = (f"a link to {quote(os.readlink(name, dir_fd=fd))}" if stat.S_ISLNK(st.st_mode)
                else "an entry that cannot be opened as a directory")
        self.aside(fd, name, upper, rule, f"{what} took the place of the directory holding "
                   f"{quote('/'.join(parts))}")
        if recorded is not None:
            os.mkdir(name, 0o755, dir_fd=fd)

    def _repo_dir(self, fd: int, name: str, rel: str, rule: str, recorded: Node) -> None:
        """A repository itself (its entries are checked one by one): a directory stays."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # gone: nothing to run
        if not stat.S_ISDIR(st.st_mode):
            self.restore(rel, rule, None, fd, name)
        elif stat.S_IMODE(st.st_mode) != stat.S_IMODE(recorded.mode) and (
                st.st_uid == os.geteuid()):
            os.chmod(name, stat.S_IMODE(recorded.mode), dir_fd=fd)

    def restore(self, rel: str, rule: str, recorded: Node | None, pfd: int, name: str) -> None:
        path = os.path.join(self.snap.workdir, rel)
        now = self._kind(pfd, name)
        q = self.move_aside(pfd, name, rel) if now else ""
        if recorded is not None and recorded.kind in ("file", "dir", "link"):
            self.materialize(pfd, name, recorded)
            if not now:
                self.say(rel, rule, "removed in the session; the original is back")
                return
            cmd = (f"rm -rf -- {command(path)} && {command('mv', '-T', '--', q, path)}"
                   if recorded.kind == "dir" else command("mv", "-f", "-T", "--", q, path))
            self.say(rel, rule, f"{now} in the session; the original is back, the session's "
                     f"version moved to {quote(q)}", cmd)
        elif now:
            what = now + (" appeared" if recorded is None else " replaced it")
            self.say(rel, rule, f"{what}; moved to {quote(q)}", command("mv", "-T", "--", q, path))

    def _kind(self, pfd: int, name: str) -> str:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return ""
        if stat.S_ISLNK(st.st_mode):
            return f"a link to {quote(os.readlink(name, dir_fd=pfd))}"
        return "a directory" if stat.S_ISDIR(st.st_mode) else "a file" if stat.S_ISREG(
            st.st_mode) else "a special file"


def _stage(pfd: int, name: str) -> str:
    """Rename ``name`` to a fresh hidden name beside it; that name."""
    # os.urandom, not secrets: importing secrets (hmac, random) cost the end up to 9 ms
    staged = f".agent-sandbox-aside-{os.urandom(6).hex()}"
    os.rename(name, staged, src_dir_fd=pfd, dst_dir_fd=pfd)
    return staged


def sweep(snap: Snapshot, state: str, *, copy_only: bool = False,
          quiet: frozenset[str] | None = None) -> list[str]:
    """Bring every host-run entry back to the snapshot; one line per entry that was not.

    Run once nothing of the session is left alive.  Idempotent: a second
    sweep (the janitor's, after a launcher killed mid-sweep) finds nothing.
    ``quiet``: the directories the live guard saw no event on (its
    ``quiet_dirs``); used only when the first step changed nothing (its own
    moves and restores came after the watch ended).
    """
    sweeper = Sweeper(snap, state, copy_only=copy_only)
    root = os.open(snap.workdir, O_DIR)
    try:
        _recorded(sweeper, root, quiet)
        from libbroker.launcher.hostrun_renamed import put_back_renamed_git

        try:
            put_back_renamed_git(sweeper, root)
        except OSError as exc:  # (EBUSY: a mount on it) the rest of the sweep goes on
            sweeper.failed = True
            sweeper.say(".", "git-dir", f"a repository moved in the session could not be moved "
                        f"back: {exc.strerror or exc}; where it is now, it is judged as a new one")
        _appeared(sweeper, root, quiet)
    finally:
        os.close(root)
        if sweeper.qfd >= 0:
            os.close(sweeper.qfd)
    _finish(sweeper)
    return sweeper.lines


def _recorded(sweeper: Sweeper, root: int, quiet: frozenset[str] | None) -> None:
    """1. Every recorded entry, shallow first: a .git replaced before its hooks.

    One chain of directory fds serves them all until the first change (a
    directory moved aside or made again: every entry after it opens its own way).
    """
    snap = sweeper.snap
    shared: Chain | None = Chain(root, fix=True)
    fast = SameByPath(root, snap.dirs, quiet)  # what the kernel shows unchanged
    try:
        for rel in sorted(snap.entries, key=lambda r: (r.count("/"), r)):
            rule, recorded = snap.entries[rel]
            if shared is not None and fast.unchanged(rel, recorded):
                continue
            said = len(sweeper.lines)
            _guard(sweeper, root, rel, rule, sweeper.check, root, rel, rule, recorded, shared)
            if shared is not None and (len(sweeper.lines) != said or sweeper.failed):
                shared.close()
                shared = None
    finally:
        if shared is not None:
            shared.close()


def _appeared(sweeper: Sweeper, root: int, quiet: frozenset[str] | None) -> None:
    """2. What appeared: walk again (unchanged directories by their ctime alone)."""
    snap = sweeper.snap
    untouched = not sweeper.lines and not sweeper.failed
    walk = Walk(snap.table, snap.dirs, fix=True, quiet=quiet if untouched else None)
    walk.run(root)
    for rel in walk.unreadable:
        _guard(sweeper, root, rel, "unreadable", _unreadable, sweeper, root, rel)
    for rel, entry in walk.found:
        if entry.rule == "git-dir":
            continue  # a new repository or gitlink: below
        if rel not in snap.entries or snap.entries[rel][1] is None:
            _guard(sweeper, root, rel, entry.rule, sweeper.check, root, rel, entry.rule, None)
    for rel, ino in walk.git_dirs:
        if snap.repos.get(rel) != ino:
            _guard(sweeper, root, rel, "git-dir", check_new_repo, sweeper, root, rel)
    judge_pointers(sweeper, root, walk)


def _unreadable(sweeper: Sweeper, root: int, rel: str) -> None:
    with parent_of(root, rel) as (pfd, name):
        if pfd >= 0 and rel:
            sweeper.aside(pfd, name, rel, "unreadable", "a directory the sweep cannot read "
                          "(what git would find in it cannot be checked)")


def _guard(sweeper: Sweeper, root: int, rel: str, rule: str, step: Callable[..., None],
           *args: object) -> None:
    """One entry's failure is not "unchanged": the entry is moved aside whole, one line."""
    try:
        step(*args)
        return
    except OSError as exc:
        why = exc.strerror or str(exc)
    try:
        with parent_of(root, rel) as (pfd, name):
            if pfd >= 0 and rel and sweeper.exists(pfd, name):
                sweeper.aside(pfd, name, rel, rule, f"could not be checked ({why})")
                return
    except OSError as exc:
        why += f"; moving it aside failed too: {exc.strerror or exc}"
    sweeper.failed = True
    sweeper.say(rel, rule, f"could not be checked or restored: {why}; look at it before "
                "using git there")


def _finish(sweeper: Sweeper) -> None:
    """The log, and the saved originals: removed once everything was put back."""
    snap = sweeper.snap
    if snap.saved and os.path.isdir(snap.saved):
        if sweeper.failed:
            sweeper.lines.append("agent-sandbox: the originals of the files above are kept in "
                                 f"{quote(snap.saved)}")
        else:
            remove_path(snap.saved)
    if sweeper.lines:
        os.makedirs(sweeper.quarantine, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(sweeper.quarantine, "sweep.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as log:
            log.write("".join(line + "\n" for line in sweeper.lines).encode())
    else:
        # The live watcher makes the session's quarantine at its start (both its threads
        # move aside into it); one that nothing was moved to is not left behind, one a
        # session: rmdir only ever removes it empty.
        with contextlib.suppress(OSError):
            os.rmdir(sweeper.quarantine)
