"""Nothing the agent writes in the workdir runs later on the host: fingerprint, then sweep.

The host-run files (:mod:`libpolicy.hostrun`: git hooks and config in every
repository, the agents' project files, editor and shell files) are looked at
twice, on the host, with the user's rights:

- :func:`scan`, at session start (in a thread, while the servers start),
  finds every repository at any depth and fingerprints every existing entry:
  type, mode, size, mtime, inode, and the content (kept in the snapshot for
  files up to :data:`SMALL` bytes, copied into the runtime dir beyond that;
  directories such as ``hooks/`` entry by entry).  It also records which git
  entries are missing.  The snapshot lives in the session's runtime dir, which
  the sandbox sees read-only, so the janitor can sweep after a ``kill -9``.
- :func:`sweep`, at session end (every exit path, the janitor's included),
  restores each entry that changed to its recorded state and moves the
  session's version aside under ``$XDG_STATE_HOME/agent-sandbox/quarantine/
  <session>/`` (nothing of the agent's is deleted); an entry that appeared is
  moved aside.  Repositories made during the session (``git init``, ``git
  clone``, a planted bare repository) keep only ``*.sample`` hooks and lose
  the config keys that run commands.  One line per entry names it and the
  command that applies the session's version after all.

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
import time
from typing import Any

from libpolicy.gitconfig import runs_commands as runs_commands  # the tests ask the guard
from libpolicy.gitconfig import sanitized_pairs
from libpolicy.hostrun import NESTED_GIT, Entry, Table

SMALL = 1 << 20  # contents kept in the snapshot itself; bigger files are copied
MAX_HELD_DIR = 5000  # files fingerprinted in one held directory (.idea/ can be big)
SNAPSHOT = "hostrun.json"  # in the runtime dir
COPIES = "hostrun-copies"  # in the runtime dir: contents bigger than SMALL
MAX_DEPTH = 256  # directory levels walked (a deeper planted tree is reported, not walked)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_GIT_SKIP = frozenset({"objects", "refs", "logs", "lfs", "rr-cache", "info", "branches"})


class Node:
    """A fingerprint: what one file, directory or link was (JSON: :meth:`to_json`)."""

    __slots__ = ("children", "digest", "ino", "kind", "link", "mode", "mtime", "size")

    def __init__(self, kind: str, mode: int = 0, size: int = 0, mtime: int = 0, ino: int = 0,
                 digest: str = "", link: str = "",
                 children: dict[str, Node] | None = None) -> None:
        self.kind = kind  # "file", "dir", "link", "other"
        self.mode, self.size, self.mtime, self.ino = mode, size, mtime, ino
        self.digest = digest  # sha256 of a file's bytes ("" when not kept: too big a dir)
        self.link = link  # a link's target
        self.children = children  # a directory's entries (None: not looked into)

    def same(self, other: Node) -> bool:
        """Whether ``other`` (found now) is what this was: type, mode, bytes, target, entries."""
        if (self.kind, stat.S_IMODE(self.mode)) != (other.kind, stat.S_IMODE(other.mode)):
            return False
        if self.kind == "file":
            return self.digest == other.digest and self.size == other.size
        if self.kind == "link":
            return self.link == other.link
        if self.kind == "dir" and self.children is not None and other.children is not None:
            return self.children.keys() == other.children.keys() and all(
                node.same(other.children[name]) for name, node in self.children.items()
            )
        return self.kind != "other"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"k": self.kind, "m": self.mode, "s": self.size,
                               "t": self.mtime, "i": self.ino}
        if self.digest:
            out["h"] = self.digest
        if self.link:
            out["l"] = self.link
        if self.children is not None:
            out["c"] = {name: node.to_json() for name, node in self.children.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        children = data.get("c")
        return cls(data["k"], data["m"], data["s"], data["t"], data["i"], data.get("h", ""),
                   data.get("l", ""),
                   None if children is None else {n: cls.from_json(c) for n, c in children.items()})


class Snapshot:
    """What the scan found: every entry's fingerprint (None: missing), every repository."""

    def __init__(self, workdir: str, session: str, table: Table) -> None:
        self.workdir = workdir
        self.session = session
        self.table = table
        self.entries: dict[str, tuple[str, Node | None]] = {}  # relpath -> (rule, fingerprint)
        self.repos: dict[str, int] = {}  # git dir relpath -> inode
        self.blobs: dict[str, bytes] = {}  # digest -> bytes (files up to SMALL)
        self.copies = ""  # where bigger files were copied ("" until one was)
        self.seconds = 0.0

    def to_json(self) -> str:
        import base64
        import json

        return json.dumps({
            "workdir": self.workdir, "session": self.session, "table": self.table.to_dict(),
            "entries": {rel: [rule, None if node is None else node.to_json()]
                        for rel, (rule, node) in self.entries.items()},
            "repos": self.repos, "copies": self.copies,
            "blobs": {h: base64.b64encode(b).decode() for h, b in self.blobs.items()},
        })

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        import base64
        import json

        data = json.loads(text)
        snap = cls(data["workdir"], data["session"], Table.from_dict(data["table"]))
        snap.entries = {rel: (rule, None if node is None else Node.from_json(node))
                        for rel, (rule, node) in data["entries"].items()}
        snap.repos = {rel: int(ino) for rel, ino in data["repos"].items()}
        snap.copies = data["copies"]
        snap.blobs = {h: base64.b64decode(b) for h, b in data["blobs"].items()}
        return snap

    def content(self, digest: str) -> bytes:
        """The recorded bytes of a file by digest."""
        if digest in self.blobs:
            return self.blobs[digest]
        fd = os.open(os.path.join(self.copies, digest), _FILE)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()


# --- looking, without following ------------------------------------------------------

def _digest(data: bytes) -> str:
    import hashlib  # imported in the scan's thread, not on the launcher's path

    return hashlib.sha256(data).hexdigest()


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _read_file(dfd: int, name: str, limit: int | None = None) -> tuple[os.stat_result, bytes]:
    """The bytes of the regular file ``name`` in ``dfd``, judged by its open fd."""
    fd = os.open(name, _FILE, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks = []
        left = st.st_size if limit is None else min(st.st_size, limit)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return st, b"".join(chunks)
    finally:
        os.close(fd)


class _Looker:
    """Fingerprints objects; keeps small contents in the snapshot, copies big ones."""

    def __init__(self, snap: Snapshot | None, copies_dir: str = "") -> None:
        self.snap = snap
        self.copies_dir = copies_dir

    def node(self, dfd: int, name: str, depth: int = 0, *, shallow: bool = False) -> Node | None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        kind = _kind(st.st_mode)
        base = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
        if kind == "link":
            return Node("link", *base, link=os.readlink(name, dir_fd=dfd))
        if kind == "file":
            try:
                st, data = _read_file(dfd, name)
            except OSError:  # swapped between stat and open: a change in itself
                return Node("other", *base)
            digest = _digest(data)
            self._keep(digest, data)
            return Node("file", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, digest)
        if kind == "dir" and shallow:  # a repository: its own entries are fingerprinted
            return Node("dir", *base)
        if kind == "dir":
            children: dict[str, Node] | None = {}
            try:
                fd = os.open(name, _DIR, dir_fd=dfd)
            except OSError:
                return Node("other", *base)
            try:
                names = sorted(os.listdir(fd))
                if len(names) > MAX_HELD_DIR or depth > 32:
                    children = None  # too big to restore entry by entry: judged by its inode
                else:
                    for child in names:
                        node = self.node(fd, child, depth + 1)
                        if node is not None and children is not None:
                            children[child] = node
            finally:
                os.close(fd)
            return Node("dir", *base, children=children)
        return Node("other", *base)

    def _keep(self, digest: str, data: bytes) -> None:
        if self.snap is None or digest in self.snap.blobs:
            return
        if len(data) <= SMALL:
            self.snap.blobs[digest] = data
            return
        if not self.copies_dir:
            return
        os.makedirs(self.copies_dir, mode=0o700, exist_ok=True)
        self.snap.copies = self.copies_dir
        path = os.path.join(self.copies_dir, digest)
        if not os.path.exists(path):
            with open(path, "wb") as fh:
                fh.write(data)


_BARE_MARKS = {"HEAD": 1, "objects": 2, "refs": 4, "commondir": 8}


def _is_git_dir(names: set[str]) -> bool:
    """git's own test (is_git_directory): HEAD, objects and refs, or a worktree's commondir."""
    return "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names)


class _Walk:
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
                        self._git_dir(dfd, _join(rel, name), name, item.inode())
                    entry = self._tree_entry((*parts, name))
                    if entry is not None and not self.table._opted_out(_join(rel, name)):
                        self.found.append((_join(rel, name), entry))
                        continue  # a held directory is fingerprinted whole
                    if is_dir and name != ".git":
                        subdirs.append((name, item.inode()))
                elif item.is_dir(follow_symlinks=False):
                    subdirs.append((name, item.inode()))
        if rel and marks & 1 and (marks & 6 == 6 or marks & 8):
            # a bare repository (HEAD, objects, refs) or a worktree's git dir, under any name
            self.git_dirs.append((rel, 0))
            subdirs = [(n, i) for n, i in subdirs if n not in _GIT_SKIP and n != "hooks"]
        for name, ino in subdirs:
            try:
                fd = os.open(name, _DIR, dir_fd=dfd)
            except OSError:
                continue
            try:
                child = _join(rel, name)
                if self.inodes:
                    self.dirs_by_ino[(os.fstat(fd).st_dev, ino)] = child
                self._dir(fd, child, (*parts, name))
            finally:
                os.close(fd)

    def _git_dir(self, dfd: int, rel: str, name: str, ino: int) -> None:
        """A git directory and the git directories inside it (modules/**, worktrees/*)."""
        self.git_dirs.append((rel, ino))
        try:
            fd = os.open(name, _DIR, dir_fd=dfd)
        except OSError:
            return
        try:
            for nested in NESTED_GIT:
                try:
                    nfd = os.open(nested, _DIR, dir_fd=fd)
                except OSError:
                    continue
                try:
                    self._nested(nfd, _join(rel, nested), 0)
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
                fd = os.open(item.name, _DIR, dir_fd=dfd)
            except OSError:
                continue
            try:
                names = set(os.listdir(fd))
                child = _join(rel, item.name)
                if _is_git_dir(names):
                    self._git_dir(dfd, child, item.name, item.inode())
                else:
                    self._nested(fd, child, depth + 1)
            finally:
                os.close(fd)


# --- the scan ------------------------------------------------------------------------

def session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def scan(workdir: str, table: Table, *, session: str = "", runtime_dir: str = "") -> Snapshot:
    """Find every repository and host-run entry in ``workdir``; fingerprint each.

    With ``runtime_dir``, the snapshot is written there for the janitor (and
    contents bigger than :data:`SMALL` copied beside it).
    """
    start = time.monotonic()
    snap = Snapshot(workdir, session or session_id(), table)
    looker = _Looker(snap, os.path.join(runtime_dir, COPIES) if runtime_dir else "")
    root = os.open(workdir, _DIR)
    walk = _Walk(table)
    try:
        walk.run(root)
        for rel, ino in walk.git_dirs:
            snap.repos[rel] = ino
            with _parent(root, rel) as (pfd, name):
                if pfd < 0:
                    continue
                gfd = os.open(name, _DIR, dir_fd=pfd)
                try:
                    for entry in table.git:
                        key = _join(rel, entry.parts[0])
                        snap.entries[key] = (entry.rule, looker.node(gfd, entry.parts[0]))
                finally:
                    os.close(gfd)
        for rel, entry in walk.found:
            with _parent(root, rel) as (pfd, name):
                if pfd >= 0:
                    node = looker.node(pfd, name, shallow=entry.rule == "git-dir")
                    snap.entries[rel] = (entry.rule, node)
    finally:
        walk.close()
        os.close(root)
    snap.seconds = time.monotonic() - start
    if runtime_dir:
        path = os.path.join(runtime_dir, SNAPSHOT)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(snap.to_json())
        os.rename(path + ".tmp", path)
    return snap


class _parent:
    """The directory fd holding ``rel``'s last name, walked one name at a time.

    Yields ``(-1, name)`` when a directory on the way is missing, a link or
    not a directory: nothing below it is reached through it.
    """

    def __init__(self, root: int, rel: str) -> None:
        self.parts = rel.split("/")
        self.root = root
        self.fd = -1

    def __enter__(self) -> tuple[int, str]:
        fd = os.dup(self.root)
        for name in self.parts[:-1]:
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                os.close(fd)
                return -1, self.parts[-1]
            os.close(fd)
            fd = nxt
        self.fd = fd
        return fd, self.parts[-1]

    def __exit__(self, *_: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)


# --- the sweep -----------------------------------------------------------------------

def state_dir(home: str = "") -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        home or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-sandbox")


class _Sweeper:
    def __init__(self, snap: Snapshot, state: str, *, copy_only: bool = False) -> None:
        self.snap = snap
        self.table = snap.table
        self.quarantine = os.path.join(state, "quarantine", snap.session)
        self.qfd = -1
        self.lines: list[str] = []
        self.copy_only = copy_only  # tests: the quarantine on another filesystem
        self.looker = _Looker(None)

    # -- moving aside
    def _qdir(self, rel: str) -> tuple[int, str]:
        """The quarantine directory fd for ``rel`` (created), and a free name in it."""
        if self.qfd < 0:
            os.makedirs(self.quarantine, mode=0o700, exist_ok=True)
            self.qfd = os.open(self.quarantine, _DIR)
        parts = rel.split("/")
        fd = os.dup(self.qfd)
        for name in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            nxt = os.open(name, _DIR, dir_fd=fd)
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
                _copy(pfd, name, qfd, qname)
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
            fd = os.open(name, _DIR, dir_fd=pfd)
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
                    nxt = os.open(name, _DIR, dir_fd=fd)
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
                    nxt = os.open(name, _DIR, dir_fd=fd)
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


def _copy(sfd: int, name: str, dfd: int, dname: str) -> None:
    """Copy ``name`` to ``dname`` without following links (a link is copied as a link)."""
    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=sfd), dname, dir_fd=dfd)
    elif stat.S_ISREG(st.st_mode):
        _, data = _read_file(sfd, name)
        fd = os.open(dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dname, 0o700, dir_fd=dfd)
        src = os.open(name, _DIR, dir_fd=sfd)
        dst = os.open(dname, _DIR, dir_fd=dfd)
        try:
            for child in os.listdir(src):
                _copy(src, child, dst, child)
        finally:
            os.close(src)
            os.close(dst)
    # fifos, sockets, devices: nothing to keep


def config_entries(data: bytes) -> list[tuple[str, str]] | None:
    """``(key, value)`` of a git config file's bytes, parsed by git itself; None if unparseable.

    The bytes come on stdin (never a path the agent could swap), and
    ``--no-includes`` keeps git from reading anything else.
    """
    import subprocess

    try:
        done = subprocess.run(["git", "config", "--file", "-", "--list", "--null",
                               "--no-includes"], input=data, capture_output=True, timeout=10,
                              check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    out = []
    for item in done.stdout.split(b"\0"):
        if item:
            key, _, value = item.decode(errors="replace").partition("\n")
            out.append((key, value))
    return out


def sanitized_config(data: bytes) -> tuple[bytes, list[str]] | None:
    """The config without its command-running keys, and those keys; None when it has none."""
    return sanitized_pairs(config_entries(data))


def sweep(snap: Snapshot, state: str, *, copy_only: bool = False) -> list[str]:
    """Bring every host-run entry back to the snapshot; one line per entry that was not.

    Run once nothing of the session is left alive.  Idempotent: a second
    sweep (the janitor's, after a launcher killed mid-sweep) finds nothing.
    """
    sweeper = _Sweeper(snap, state, copy_only=copy_only)
    root = os.open(snap.workdir, _DIR)
    try:
        # 1. Every recorded entry, shallow first: a .git replaced before its hooks.
        for rel in sorted(snap.entries, key=lambda r: (r.count("/"), r)):
            rule, recorded = snap.entries[rel]
            _guard(sweeper, rel, sweeper.check, root, rel, rule, recorded)
        _put_back_renamed_git(sweeper, root)
        # 2. What appeared: walk again, fds all the way down.
        walk = _Walk(snap.table)
        try:
            walk.run(root)
        finally:
            walk.close()
        for rel, entry in walk.found:
            if rel not in snap.entries or snap.entries[rel][1] is None:
                if rel.endswith(".git") and entry.rule == "git-dir":
                    _guard(sweeper, rel, _gitlink, sweeper, root, rel, snap)
                else:
                    _guard(sweeper, rel, sweeper.check, root, rel, entry.rule, None)
        for rel, _ in walk.git_dirs:
            if rel in snap.repos:
                continue
            _guard(sweeper, rel, _new_repo, sweeper, root, rel)
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


def _guard(sweeper: _Sweeper, rel: str, step: Any, *args: Any) -> None:
    """One entry's failure (a permission, a full disk) is reported, and the sweep goes on."""
    try:
        step(*args)
    except OSError as exc:
        sweeper.lines.append(f"agent-sandbox: {rel}: could not be checked or restored: "
                             f"{exc.strerror or exc}; look at it before using git there")


def _put_back_renamed_git(sweeper: _Sweeper, root: int) -> None:
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
        with _parent(root, rel) as (pfd, name):
            if pfd < 0:
                continue
            now = sweeper.looker.node(pfd, name, shallow=True)
            if now is None or now.ino != ino:
                displaced[ino] = rel
    if not displaced:
        return
    walk = _Walk(snap.table, inodes=True)
    try:
        walk.run(root)
    finally:
        walk.close()
    for (_, ino), where in walk.dirs_by_ino.items():
        if ino not in displaced:
            continue
        rel = displaced[ino]
        path = os.path.join(snap.workdir, rel)
        with _parent(root, rel) as (dfd, dname):
            if dfd < 0:
                continue
            now = sweeper.looker.node(dfd, dname, shallow=True)
            if now is not None:
                q = sweeper.move_aside(dfd, dname, rel)
                sweeper.say(rel, "git-dir", f"a {now.kind} took the repository's place in the "
                            f"session; moved to {shlex.quote(q)}", "")
            with _parent(root, where) as (sfd, sname):
                if sfd < 0:
                    continue
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        sweeper.say(rel, "git-dir", f"the repository was moved to {where} in the session; "
                    f"moved back to {shlex.quote(path)}", "")
        # Its entries were checked where they stood: check them again.
        for entry_rel, (rule, recorded) in snap.entries.items():
            if entry_rel.startswith(rel + "/"):
                sweeper.check(root, entry_rel, rule, recorded)


def _gitlink(sweeper: _Sweeper, root: int, rel: str, snap: Snapshot) -> None:
    """A ``.git`` that appeared: a repository is checked as new; a file or link is moved aside
    unless it names a git dir the sweep itself checks (a submodule's or worktree's)."""
    with _parent(root, rel) as (pfd, name):
        if pfd < 0:
            return
        now = sweeper.looker.node(pfd, name)
        if now is None or now.kind == "dir":
            return  # a new repository: _new_repo
        if now.kind == "file":
            try:
                _, data = _read_file(pfd, name, 4096)
            except OSError:
                data = b""
            if _gitlink_ok(snap, root, rel, data):
                return
        sweeper.check(root, rel, "git-dir", None)


def _gitlink_ok(snap: Snapshot, root: int, rel: str, data: bytes) -> bool:
    text = data.decode(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return False
    target = text[len("gitdir:"):].strip()
    if target.startswith("/"):
        if not target.startswith(snap.workdir + "/"):
            return False
        target = target[len(snap.workdir) + 1:]
    else:
        target = os.path.join(os.path.dirname(rel), target)
    target = os.path.normpath(target)
    parts = target.split("/")
    if target.startswith("..") or ".git" not in parts:
        return False
    at = parts.index(".git")
    if len(parts) < at + 3 or parts[at + 1] not in NESTED_GIT:
        return False
    # Every directory on the way must be a directory, not a link (fds, one name each).
    with _parent(root, target + "/HEAD") as (fd, _):
        return fd >= 0


def _new_repo(sweeper: _Sweeper, root: int, rel: str) -> None:
    """A repository that was not there at the start: sample hooks only, no command-running keys."""
    with _parent(root, rel + "/x") as (gfd, _):
        if gfd < 0:
            return
        worktree = "/worktrees/" in f"/{rel}"
        # hooks/: only git's *.sample files stay (git never runs them).
        hooks = sweeper.looker.node(gfd, "hooks")
        if hooks is not None and hooks.kind != "dir":
            q = sweeper.move_aside(gfd, "hooks", f"{rel}/hooks")
            path = os.path.join(sweeper.snap.workdir, rel, "hooks")
            sweeper.say(f"{rel}/hooks", "git-hooks", f"a {hooks.kind} in a repository made in "
                        f"the session; moved to {shlex.quote(q)}",
                        f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")
        elif hooks is not None and hooks.children is not None:
            hfd = os.open("hooks", _DIR, dir_fd=gfd)
            try:
                for name, node in hooks.children.items():
                    if node.kind == "file" and name.endswith(".sample"):
                        continue
                    q = sweeper.move_aside(hfd, name, f"{rel}/hooks/{name}")
                    path = os.path.join(sweeper.snap.workdir, rel, "hooks", name)
                    sweeper.say(f"{rel}/hooks/{name}", "git-hooks",
                                f"a hook in a repository made in the session; moved to "
                                f"{shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} "
                                f"{shlex.quote(path)}")
            finally:
                os.close(hfd)
        for name, rule in (("config", "git-config"), ("config.worktree", "git-config-worktree")):
            _sanitize_config(sweeper, gfd, rel, name, rule)
        common = sweeper.looker.node(gfd, "commondir")
        if common is not None:
            ok = False
            if worktree and common.kind == "file":
                try:
                    ok = _read_file(gfd, "commondir", 64)[1].strip() == b"../.."
                except OSError:
                    ok = False
            if not ok:
                q = sweeper.move_aside(gfd, "commondir", f"{rel}/commondir")
                path = os.path.join(sweeper.snap.workdir, rel, "commondir")
                sweeper.say(f"{rel}/commondir", "git-commondir",
                            f"redirects a repository made in the session; moved to "
                            f"{shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")


def _sanitize_config(sweeper: _Sweeper, gfd: int, rel: str, name: str, rule: str) -> None:
    node = sweeper.looker.node(gfd, name)
    if node is None:
        return
    entry_rel = f"{rel}/{name}"
    path = os.path.join(sweeper.snap.workdir, entry_rel)
    if node.kind != "file":
        q = sweeper.move_aside(gfd, name, entry_rel)
        sweeper.say(entry_rel, rule, f"not a file in a repository made in the session; moved "
                    f"to {shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")
        return
    _, data = _read_file(gfd, name)
    result = sanitized_config(data)
    if result is None:
        return
    clean, keys = result
    q = sweeper.move_aside(gfd, name, entry_rel)
    digest = _digest(clean)
    sweeper.snap.blobs[digest] = clean
    sweeper.materialize(gfd, name, Node("file", 0o644, len(clean), time.time_ns(), 0, digest))
    sweeper.say(entry_rel, rule, f"a repository made in the session names commands in its "
                f"config ({', '.join(keys)}); those keys are dropped, the whole file moved to "
                f"{shlex.quote(q)}", f"mv -f -T -- {shlex.quote(q)} {shlex.quote(path)}")


# --- for the launcher ----------------------------------------------------------------

class Guard:
    """One session's guard: the scan in a thread from the start, the sweep at the end.

    The scan overlaps the servers' start (its directory reads release the
    GIL, and the launcher mostly waits on their ``listening`` lines);
    :meth:`wait` joins it before the command may run.  :meth:`finish` sweeps
    (once every process of the session is gone) and prints its lines.
    """

    def __init__(self, workdir: str, table: Table, runtime_dir: str, state: str) -> None:
        import threading

        self.state = state
        self.snap: Snapshot | None = None
        self.error: BaseException | None = None
        self._args = (workdir, table, runtime_dir)
        self._thread = threading.Thread(target=self._scan, name="hostrun-scan", daemon=True)
        self._thread.start()

    def _scan(self) -> None:
        workdir, table, runtime_dir = self._args
        try:
            self.snap = scan(workdir, table, runtime_dir=runtime_dir)
        except BaseException as exc:  # reported by wait(), in the launcher's thread
            self.error = exc

    def wait(self) -> Snapshot:
        """The snapshot, once the scan is done; LaunchError if it failed (no session then)."""
        self._thread.join()
        if self.snap is None:
            from libbroker.errors import LaunchError

            why = self.error.strerror if isinstance(self.error, OSError) else self.error
            raise LaunchError(f"cannot look at the workdir's host-run files: {why}")
        return self.snap

    def finish(self, out: int = 2) -> list[str]:
        """Sweep (nothing of the session may be alive) and write its lines to ``out``."""
        self._thread.join()
        if self.snap is None:
            return []
        snap, self.snap = self.snap, None
        try:
            lines = sweep(snap, self.state)
        except Exception as exc:  # the teardown goes on; the person is told
            why = exc.strerror if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            lines = [f"agent-sandbox: the sweep of {snap.workdir} failed: {why}; "
                     "check its git hooks and config before using git there"]
        if lines:
            text = "".join(line + "\n" for line in lines)
            with contextlib.suppress(OSError):
                os.write(out, text.encode(errors="replace"))
        return lines


def janitor_sweep(runtime_dir: str) -> None:
    """The janitor's sweep, after a launcher killed before its own (lines go to sweep.log)."""
    snap = load(runtime_dir)
    if snap is not None:
        sweep(snap, state_dir())

def load(runtime_dir: str) -> Snapshot | None:
    """The snapshot the scan left in ``runtime_dir``, if any."""
    try:
        fd = os.open(os.path.join(runtime_dir, SNAPSHOT), _FILE)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return Snapshot.from_json(fh.read())


def bwrap_protect(snap: Snapshot) -> list[str]:
    """Existing entries to hold read-only in a bwrap sandbox (``--ro-bind P P`` each).

    Every repository's hooks, config, commondir and config.worktree (its
    modules' and worktrees' too) and every other existing entry.  Bind them
    after :func:`bwrap_pin`'s: a bind onto a mount point's inside stays.
    """
    out = []
    for rel, (_, node) in sorted(snap.entries.items()):
        # A repository's own directory is pinned, not held: git inside the
        # sandbox writes its objects, index and refs there.
        if node is not None and node.kind in ("file", "dir") and rel not in snap.repos:
            out.append(os.path.join(snap.workdir, rel))
    return out


def bwrap_pin(snap: Snapshot) -> list[str]:
    """The git directories to bind onto themselves (``--bind P P``): a mount point cannot be
    renamed or removed (EBUSY), so ``mv .git .git-away`` fails inside the sandbox."""
    return [os.path.join(snap.workdir, rel) for rel, ino in sorted(snap.repos.items()) if ino]


def bwrap_args(snap: Snapshot) -> list[str]:
    """bwrap's arguments for both, in order, to follow the workdir's ``--bind``."""
    argv: list[str] = []
    for path in bwrap_pin(snap):
        argv += ["--bind", path, path]
    for path in bwrap_protect(snap):
        argv += ["--ro-bind", path, path]
    return argv


