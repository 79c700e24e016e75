"""The host-run guard's fingerprints: what one entry was, and the snapshot of them all.

A :class:`Node` records one file, directory or link (type, mode, size,
mtime, ctime, inode, a small file's sha256, a link's target, a directory's
entries); a :class:`Snapshot` holds every host-run entry's node, every
repository and every directory the scan saw, as JSON for the janitor (names
that are not UTF-8 round-trip: JSON escapes Python's surrogates).

:class:`Looker` makes nodes without following links and keeps what the sweep
may have to write back, lossless: files up to :data:`SMALL` bytes in the
snapshot itself, bigger ones as saved copies (a reflink, else their data
segments) in the state dir, which outlives the runtime dir, the launcher and
the janitor.  It also judges, at the end, whether an entry is what it was:
a file whose inode, size, mtime and ctime are all unchanged is unchanged (a
ctime cannot be set back from user space); else its bytes are hashed,
streaming, and compared.  Anything it cannot open, read or hash is changed.
"""

from __future__ import annotations

import errno
import os
import stat
from binascii import a2b_base64, b2a_base64
from typing import Any

from libbroker.launcher.hostrun_fs import (
    O_NEW,
    Chain,
    clone_into,
    hash_fd,
    open_file,
    sha256,
)
from libbroker.launcher.hostrun_fs import parent_of as parent_of  # hostrun_live's import
from libpolicy.hostrun import Table

SMALL = 1 << 20  # contents kept in the snapshot itself; bigger files are saved copies


class Node:
    """A fingerprint: what one file, directory or link was (JSON: :meth:`to_json`)."""

    __slots__ = ("children", "copy", "ctime", "digest", "ino", "kind", "link", "mode", "mtime",
                 "size")

    def __init__(self, kind: str, mode: int = 0, size: int = 0, mtime: int = 0, ino: int = 0,
                 digest: str = "", link: str = "", children: dict[str, Node] | None = None,
                 ctime: int = 0, copy: str = "") -> None:
        self.kind = kind  # "file", "dir", "link", "other"
        self.mode, self.size, self.mtime, self.ino, self.ctime = mode, size, mtime, ino, ctime
        self.digest = digest  # sha256 of a small file's bytes ("" for a big one: see copy)
        self.copy = copy  # a big file's saved copy, in the snapshot's saved dir
        self.link = link  # a link's target
        self.children = children  # a directory's entries (None: not looked into)

    @classmethod
    def of(cls, st: os.stat_result, **kw: Any) -> Node:
        return cls(kind_of(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino,
                   ctime=st.st_ctime_ns, **kw)

    def same_stat(self, st: os.stat_result) -> bool:
        """Unchanged by what the kernel says: inode, size, mtime, ctime and mode."""
        return (self.ino, self.size, self.mtime, self.ctime, self.mode) == (
            st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"k": self.kind, "m": self.mode, "s": self.size,
                               "t": self.mtime, "i": self.ino, "ct": self.ctime}
        for key, value in (("h", self.digest), ("l", self.link), ("cp", self.copy)):
            if value:
                out[key] = value
        if self.children is not None:
            out["c"] = {name: node.to_json() for name, node in self.children.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        children = data.get("c")
        return cls(data["k"], data["m"], data["s"], data["t"], data["i"], data.get("h", ""),
                   data.get("l", ""),
                   None if children is None else {n: cls.from_json(c) for n, c in children.items()},
                   ctime=data.get("ct", 0), copy=data.get("cp", ""))


class Snapshot:
    """What the scan found: every entry's fingerprint (None: missing), every repository."""

    def __init__(self, workdir: str, session: str, table: Table) -> None:
        self.workdir = workdir
        self.session = session
        self.table = table
        self.entries: dict[str, tuple[str, Node | None]] = {}  # relpath -> (rule, fingerprint)
        self.repos: dict[str, int] = {}  # git dir relpath -> inode
        self.dirs: dict[str, list[Any]] = {}  # every directory walked (hostrun_walk.Walk.dirs)
        self.targets: list[tuple[int, int]] = []  # (dev, ino) of git dirs outside, named at start
        self.blobs: dict[str, bytes] = {}  # digest -> bytes (files up to SMALL)
        self.saved = ""  # the directory of saved copies (bigger files), in the state dir
        self.finished = 0  # CLOCK_REALTIME ns when the scan ended
        self.seconds = 0.0

    def to_json(self) -> str:
        import json

        return json.dumps({
            "workdir": self.workdir, "session": self.session, "table": self.table.to_dict(),
            "entries": {rel: [rule, None if node is None else node.to_json()]
                        for rel, (rule, node) in self.entries.items()},
            "repos": self.repos, "dirs": self.dirs, "targets": self.targets,
            "saved": self.saved, "finished": self.finished,
            # binascii: base64's b64encode without base64's import (the scan's thread)
            "blobs": {h: b2a_base64(b, newline=False).decode() for h, b in self.blobs.items()},
        })

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        import json

        data = json.loads(text)
        snap = cls(data["workdir"], data["session"], Table.from_dict(data["table"]))
        snap.entries = {rel: (rule, None if node is None else Node.from_json(node))
                        for rel, (rule, node) in data["entries"].items()}
        snap.repos = {rel: int(ino) for rel, ino in data["repos"].items()}
        snap.dirs = data["dirs"]
        snap.targets = [(int(d), int(i)) for d, i in data["targets"]]
        snap.saved = data["saved"]
        snap.finished = int(data["finished"])
        snap.blobs = {h: a2b_base64(b) for h, b in data["blobs"].items()}  # b64decode's
        return snap

    def open_saved(self, node: Node) -> int:
        """A read fd on the saved copy of the big file ``node``; OSError when none was kept."""
        if not node.copy or not self.saved:
            raise OSError(errno.ENOENT, "no copy of the original was kept")
        return os.open(os.path.join(self.saved, node.copy), os.O_RDONLY | os.O_CLOEXEC)


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def digest_of(data: bytes) -> str:
    return sha256(data).hexdigest()


def digest_of_fd(fd: int) -> str:
    """:func:`digest_of` the file's bytes, read from ``fd`` in bounded chunks: the live
    gate's check of a host-run file restored as a new inode against what the start
    recorded (the same digest by construction)."""
    digest = sha256()
    at = 0
    while chunk := os.pread(fd, 1 << 16, at):
        digest.update(chunk)
        at += len(chunk)
    return digest.hexdigest()


def read_small(fd: int, limit: int = SMALL, size: int = -1) -> bytes:
    """At most ``limit`` + 1 bytes of ``fd`` from its start (one more tells it grew).

    Read until a read returns nothing (a short read is not taken for the end), in
    chunks of 64 KiB, the first one ``size`` + 1 bytes when the caller knows the size
    (os.pread allocates what it is asked for: a MiB per 1 KiB hook cost ms)."""
    chunks, left, at = [], limit + 1, 0
    want = size + 1 if 0 <= size < limit else 1 << 16
    while left > 0:
        chunk = os.pread(fd, min(left, want), at)
        want = 1 << 16
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
        at += len(chunk)
    return b"".join(chunks)


class Looker:
    """Fingerprints entries at the start; at the end, judges whether they are what they were."""

    def __init__(self, snap: Snapshot, *, fix: bool = False) -> None:
        self.snap = snap
        self.fix = fix  # at the end: the owner's bits given back before a refusal counts
        self._saved = 0

    # -- at the start
    def node(self, dfd: int, name: str, *, shallow: bool = False) -> Node | None:
        """``name``'s fingerprint (a directory's whole tree unless ``shallow``); None: missing."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        top = self._one(dfd, name, st)
        if top.kind != "dir" or shallow:
            return top
        stack: list[tuple[Node, tuple[str, ...]]] = [(top, (name,))]
        with Chain(dfd, fix=self.fix) as chain:
            while stack:
                node, parts = stack.pop()
                try:
                    fd = chain.fd(parts)
                    items = sorted(os.listdir(fd))
                except OSError:
                    node.kind = "other"  # judged by its inode and ctime alone
                    continue
                node.children = {}
                for child in items:
                    try:
                        cst = os.stat(child, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    node.children[child] = sub = self._one(fd, child, cst)
                    if sub.kind == "dir":
                        stack.append((sub, (*parts, child)))
        return top

    def _one(self, dfd: int, name: str, st: os.stat_result) -> Node:
        node = Node.of(st)
        if node.kind == "link":
            node.link = os.readlink(name, dir_fd=dfd)
        elif node.kind == "file":
            try:
                fd = open_file(dfd, name, fix=self.fix)
            except OSError:  # unreadable, or swapped between stat and open
                node.kind = "other"
                return node
            try:
                self._keep(fd, node)
            finally:
                os.close(fd)
        return node

    def _keep(self, fd: int, node: Node) -> None:
        st = os.fstat(fd)
        if st.st_ino != node.ino or not stat.S_ISREG(st.st_mode):
            node.kind = "other"
            return
        if st.st_size <= SMALL:
            data = read_small(fd, SMALL, st.st_size)
            if len(data) <= SMALL:
                node.digest = digest_of(data)
                self.snap.blobs.setdefault(node.digest, data)
                return
        if not self.snap.saved:
            node.kind = "other"  # no place to keep it (a scan for tests): judged by its stat
            return
        os.makedirs(self.snap.saved, mode=0o700, exist_ok=True)
        self._saved += 1
        node.copy = f"{self._saved}-{node.ino}"
        out = os.open(os.path.join(self.snap.saved, node.copy), O_NEW, 0o600)
        try:
            clone_into(fd, out)  # OSError (a full disk): no session, nothing lost
        finally:
            os.close(out)

    # -- at the end
    def unchanged(self, recorded: Node, dfd: int, name: str) -> bool:
        """Whether ``name`` is still what ``recorded`` was (a directory: its whole tree).

        Iterative; stops at the first difference, so a planted tree of any
        size costs no more than the recorded one.
        """
        stack: list[tuple[Node, int, str, tuple[str, ...]]] = [(recorded, dfd, name, ())]
        with Chain(dfd, fix=self.fix) as chain:
            while stack:
                rec, pfd, child, parts = stack.pop()
                if pfd < 0:
                    try:
                        pfd = chain.fd((name, *parts[:-1]))
                    except OSError:
                        return False
                if not self._same_one(rec, pfd, child):
                    return False
                if rec.kind != "dir" or rec.children is None:
                    continue
                try:
                    fd = chain.fd((name, *parts))
                    names = os.listdir(fd)
                except OSError:
                    return False
                if sorted(names) != sorted(rec.children):
                    return False
                for sub, node in rec.children.items():
                    stack.append((node, -1, sub, (*parts, sub)))
        return True

    def _same_one(self, rec: Node, dfd: int, name: str) -> bool:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return False
        if kind_of(st.st_mode) != rec.kind and rec.kind != "other":
            return False
        if rec.kind == "other" or (rec.kind == "file" and rec.same_stat(st)):
            return rec.same_stat(st)
        if stat.S_IMODE(st.st_mode) != stat.S_IMODE(rec.mode):
            return False
        if rec.kind == "link":
            try:
                return os.readlink(name, dir_fd=dfd) == rec.link
            except OSError:
                return False
        if rec.kind == "file":
            return st.st_size == rec.size and self._same_bytes(rec, dfd, name)
        return True  # a directory: its entries are the caller's

    def _same_bytes(self, rec: Node, dfd: int, name: str) -> bool:
        try:
            fd = open_file(dfd, name, fix=self.fix)
        except OSError:
            return False
        try:
            if rec.digest:
                data = read_small(fd, SMALL, rec.size)
                return len(data) <= SMALL and digest_of(data) == rec.digest
            with_copy = self.snap.open_saved(rec)
            try:
                return hash_fd(fd) == hash_fd(with_copy)
            finally:
                os.close(with_copy)
        except OSError:
            return False
        finally:
            os.close(fd)
