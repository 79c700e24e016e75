"""The host-run guard's sweep, at session end: every host-run entry back to its snapshot.

:func:`sweep` (every exit path, the janitor's included) restores each entry
that changed to its recorded state and moves the session's version aside
under ``$XDG_STATE_HOME/agent-sandbox/quarantine/<session>/`` (nothing of
the agent's is deleted); an entry that appeared is moved aside.  Repositories
made during the session are left to :mod:`.hostrun_newrepo`.  One line per
entry names it and the command that applies the session's version after all.

The sweep walks a tree the agent controlled, so it never follows a link:
every lookup is one name relative to a directory fd (``O_NOFOLLOW``, and
``O_DIRECTORY`` for directories), each file is judged by what its open fd
says, moves are ``renameat`` (which moves a link, never its target), and
restores write a temporary file beside the entry and rename it into place.
A link where an entry (or a directory above one) was is itself a change: it
is moved aside and the recorded entry written in its place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
from typing import Any

from libbroker.launcher.hostrun_fingerprint import (
    O_DIR,
    Looker,
    Node,
    Snapshot,
    parent_of,
    read_file,
)
from libbroker.launcher.hostrun_newrepo import check_new_gitlink, check_new_repo
from libbroker.launcher.hostrun_walk import MAX_DEPTH, Walk


def state_dir(home: str = "") -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        home or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-sandbox")


class Sweeper:
    def __init__(self, snap: Snapshot, state: str, *, copy_only: bool = False) -> None:
        self.snap = snap
        self.table = snap.table
        self.quarantine = os.path.join(state, "quarantine", snap.session)
        self.qfd = -1
        self.lines: list[str] = []
        self.copy_only = copy_only  # tests: the quarantine on another filesystem
        self.looker = Looker(None)

    # -- moving aside
    def _qdir(self, rel: str) -> tuple[int, str]:
        """The quarantine directory fd for ``rel`` (created), and a free name in it."""
        if self.qfd < 0:
            os.makedirs(self.quarantine, mode=0o700, exist_ok=True)
            self.qfd = os.open(self.quarantine, O_DIR)
        parts = rel.split("/")
        fd = os.dup(self.qfd)
        for name in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            nxt = os.open(name, O_DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        name, n = parts[-1], 0
        while True:
            try:
                os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return fd, name
            n += 1
            name = f"{parts[-1]}.{n}"

    def move_aside(self, pfd: int, name: str, rel: str) -> str:
        """Move ``name`` (whatever it is; a link stays a link) into the quarantine."""
        qfd, qname = self._qdir(rel)
        try:
            try:
                if self.copy_only:
                    raise OSError(errno.EXDEV, "forced copy")
                os.rename(name, qname, src_dir_fd=pfd, dst_dir_fd=qfd)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                copy_whole(pfd, name, qfd, qname)
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    import shutil

                    shutil.rmtree(name, dir_fd=pfd)  # fd-based: never follows a link
                else:
                    os.unlink(name, dir_fd=pfd)
        finally:
            os.close(qfd)
        return os.path.join(self.quarantine, os.path.dirname(rel), qname)

    # -- writing back
    def materialize(self, pfd: int, name: str, node: Node) -> None:
        """Write the recorded ``node`` as ``name`` in ``pfd`` (which holds nothing by that name)."""
        if node.kind == "link":
            os.symlink(node.link, name, dir_fd=pfd)
        elif node.kind == "file":
            data = self.snap.content(node.digest)
            tmp = f".{name}.agent-sandbox-restore"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=pfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=pfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, stat.S_IMODE(node.mode))
                os.utime(fd, ns=(node.mtime, node.mtime))
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        elif node.kind == "dir":
            os.mkdir(name, 0o700, dir_fd=pfd)
            fd = os.open(name, O_DIR, dir_fd=pfd)
            try:
                for child, sub in (node.children or {}).items():
                    self.materialize(fd, child, sub)
                os.fchmod(fd, stat.S_IMODE(node.mode))
            finally:
                os.close(fd)

    def say(self, rel: str, rule: str, what: str, command: str) -> None:
        path = os.path.join(self.snap.workdir, rel)
        line = f"agent-sandbox: {rel} [{rule}]: {what}"
        if command:
            line += f"; to apply the session's version: {command}"
        self.lines.append(line.replace(path, shlex.quote(path)) if " " in path else line)

    # -- one entry
    def restore(self, root: int, rel: str, rule: str, recorded: Node | None,
                now_node: Node | None, pfd: int, name: str) -> None:
        path = os.path.join(self.snap.workdir, rel)
        q = ""
        if now_node is not None:
            q = self.move_aside(pfd, name, rel)
        if recorded is not None and recorded.kind in ("file", "dir", "link") and (
            recorded.kind != "dir" or recorded.children is not None
        ):
            self.materialize(pfd, name, recorded)
            if now_node is None:
                self.say(rel, rule, "removed in the session; the original is back", "")
                return
            qp, pp = shlex.quote(q), shlex.quote(path)
            cmd = (f"rm -rf -- {pp} && mv -T -- {qp} {pp}" if recorded.kind == "dir"
                   else f"mv -f -T -- {qp} {pp}")
            what = ("replaced by a link to " + shlex.quote(now_node.link)
                    if now_node.kind == "link" else "changed in the session")
            self.say(rel, rule, f"{what}; the original is back, the session's version moved "
                     f"to {qp}", cmd)
        elif now_node is not None:
            what = "a link to " + shlex.quote(now_node.link) if now_node.kind == "link" else (
                "a " + now_node.kind)
            what += " appeared" if recorded is None else " replaced it"
            self.say(rel, rule, f"{what}; moved to {shlex.quote(q)}",
                     f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")

    def check(self, root: int, rel: str, rule: str, recorded: Node | None) -> None:
        """Bring one entry back to its recorded state (``recorded`` None: it was missing)."""
        parts = rel.split("/")
        fd = os.dup(root)
        try:
            for i, name in enumerate(parts[:-1]):
                try:
                    nxt = os.open(name, O_DIR, dir_fd=fd)
                except OSError:
                    found = self.looker.node(fd, name)
                    if found is None or found.kind != "link" or recorded is None:
                        return  # gone, or a file: nothing beneath it can be reached
                    # A link where a directory above an entry was: moved aside,
                    # the directory made again, so the entry is written, not through.
                    upper = "/".join(parts[: i + 1])
                    q = self.move_aside(fd, name, upper)
                    self.say(upper, rule, f"a link to {shlex.quote(found.link)} replaced the "
                             f"directory holding {rel}; moved to {shlex.quote(q)}", "")
                    os.mkdir(name, 0o755, dir_fd=fd)
                    nxt = os.open(name, O_DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
            name = parts[-1]
            now_node = self.looker.node(fd, name, shallow=rule == "git-dir")
            if recorded is None and now_node is None:
                return
            if recorded is not None and now_node is not None and recorded.same(now_node):
                return
            if (recorded is not None and recorded.kind == "dir" and recorded.children is None
                    and now_node is not None and now_node.kind == "dir"):
                return  # a repository or a huge directory: its own entries are checked
            self.restore(root, rel, rule, recorded, now_node, fd, name)
        finally:
            os.close(fd)


def copy_whole(sfd: int, name: str, dfd: int, dname: str) -> None:
    """Copy ``name`` to ``dname`` without following links (a link is copied as a link)."""
    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=sfd), dname, dir_fd=dfd)
    elif stat.S_ISREG(st.st_mode):
        _, data = read_file(sfd, name)
        fd = os.open(dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dname, 0o700, dir_fd=dfd)
        src = os.open(name, O_DIR, dir_fd=sfd)
        dst = os.open(dname, O_DIR, dir_fd=dfd)
        try:
            for child in os.listdir(src):
                copy_whole(src, child, dst, child)
        finally:
            os.close(src)
            os.close(dst)
    # fifos, sockets, devices: nothing to keep


def sweep(snap: Snapshot, state: str, *, copy_only: bool = False) -> list[str]:
    """Bring every host-run entry back to the snapshot; one line per entry that was not.

    Run once nothing of the session is left alive.  Idempotent: a second
    sweep (the janitor's, after a launcher killed mid-sweep) finds nothing.
    """
    sweeper = Sweeper(snap, state, copy_only=copy_only)
    root = os.open(snap.workdir, O_DIR)
    try:
        # 1. Every recorded entry, shallow first: a .git replaced before its hooks.
        for rel in sorted(snap.entries, key=lambda r: (r.count("/"), r)):
            rule, recorded = snap.entries[rel]
            _guard(sweeper, rel, sweeper.check, root, rel, rule, recorded)
        _put_back_renamed_git(sweeper, root)
        # 2. What appeared: walk again, fds all the way down.
        walk = Walk(snap.table)
        try:
            walk.run(root)
        finally:
            walk.close()
        for rel, entry in walk.found:
            if rel not in snap.entries or snap.entries[rel][1] is None:
                if rel.endswith(".git") and entry.rule == "git-dir":
                    _guard(sweeper, rel, check_new_gitlink, sweeper, root, rel, snap)
                else:
                    _guard(sweeper, rel, sweeper.check, root, rel, entry.rule, None)
        for rel, _ in walk.git_dirs:
            if rel in snap.repos:
                continue
            _guard(sweeper, rel, check_new_repo, sweeper, root, rel)
        for rel in walk.too_deep:
            sweeper.lines.append(f"agent-sandbox: {rel}: more than {MAX_DEPTH} directories "
                                 "deep, not swept below; look at it before using git there")
    finally:
        os.close(root)
        if sweeper.qfd >= 0:
            os.close(sweeper.qfd)
    if sweeper.lines:
        os.makedirs(sweeper.quarantine, mode=0o700, exist_ok=True)
        with open(os.path.join(sweeper.quarantine, "sweep.log"), "a") as log:
            log.write("".join(line + "\n" for line in sweeper.lines))
    return sweeper.lines


def _guard(sweeper: Sweeper, rel: str, step: Any, *args: Any) -> None:
    """One entry's failure (a permission, a full disk) is reported, and the sweep goes on."""
    try:
        step(*args)
    except OSError as exc:
        sweeper.lines.append(f"agent-sandbox: {rel}: could not be checked or restored: "
                             f"{exc.strerror or exc}; look at it before using git there")


def _put_back_renamed_git(sweeper: Sweeper, root: int) -> None:
    """A recorded .git found elsewhere (by inode) goes back; what took its place goes aside.

    ``mv .git .git-away && cp -r .git-away .git`` leaves a copy where the
    repository was: the copy (with whatever the session did in it) is moved
    aside, the original moved back.  A .git that is simply gone stays gone.
    """
    snap = sweeper.snap
    displaced = {}
    for rel, ino in snap.repos.items():
        if not ino or not rel.endswith(".git"):
            continue
        with parent_of(root, rel) as (pfd, name):
            if pfd < 0:
                continue
            now = sweeper.looker.node(pfd, name, shallow=True)
            if now is None or now.ino != ino:
                displaced[ino] = rel
    if not displaced:
        return
    walk = Walk(snap.table, inodes=True)
    try:
        walk.run(root)
    finally:
        walk.close()
    for (_, ino), where in walk.dirs_by_ino.items():
        if ino not in displaced:
            continue
        rel = displaced[ino]
        path = os.path.join(snap.workdir, rel)
        with parent_of(root, rel) as (dfd, dname):
            if dfd < 0:
                continue
            now = sweeper.looker.node(dfd, dname, shallow=True)
            if now is not None:
                q = sweeper.move_aside(dfd, dname, rel)
                sweeper.say(rel, "git-dir", f"a {now.kind} took the repository's place in the "
                            f"session; moved to {shlex.quote(q)}", "")
            with parent_of(root, where) as (sfd, sname):
                if sfd < 0:
                    continue
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        sweeper.say(rel, "git-dir", f"the repository was moved to {where} in the session; "
                    f"moved back to {shlex.quote(path)}", "")
        # Its entries were checked where they stood: check them again.
        for entry_rel, (rule, recorded) in snap.entries.items():
            if entry_rel.startswith(rel + "/"):
                sweeper.check(root, entry_rel, rule, recorded)
