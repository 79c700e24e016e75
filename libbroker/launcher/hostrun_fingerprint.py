"""The host-run guard's fingerprints: what one entry was, and the snapshot of them all.

A :class:`Node` records one file, directory or link (type, mode, size, mtime,
inode, a file's sha256, a link's target, a directory's entries); a
:class:`Snapshot` holds every host-run entry's node and every repository the
scan found, as JSON for the janitor.  :class:`Looker` makes nodes without
following links (one name relative to a directory fd, each file judged by
its open fd) and keeps the contents the sweep may have to write back.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from libpolicy.hostrun import Table

SMALL = 1 << 20  # contents kept in the snapshot itself; bigger files are copied
MAX_HELD_DIR = 5000  # files fingerprinted in one held directory (.idea/ can be big)
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
        fd = os.open(os.path.join(self.copies, digest), O_FILE)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()


# --- looking, without following ------------------------------------------------------

def digest_of(data: bytes) -> str:
    import hashlib  # imported in the scan's thread, not on the launcher's path

    return hashlib.sha256(data).hexdigest()


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def read_file(dfd: int, name: str, limit: int | None = None) -> tuple[os.stat_result, bytes]:
    """The bytes of the regular file ``name`` in ``dfd``, judged by its open fd."""
    fd = os.open(name, O_FILE, dir_fd=dfd)
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


class Looker:
    """Fingerprints objects; keeps small contents in the snapshot, copies big ones."""

    def __init__(self, snap: Snapshot | None, copies_dir: str = "") -> None:
        self.snap = snap
        self.copies_dir = copies_dir

    def node(self, dfd: int, name: str, depth: int = 0, *, shallow: bool = False) -> Node | None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        kind = kind_of(st.st_mode)
        base = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
        if kind == "link":
            return Node("link", *base, link=os.readlink(name, dir_fd=dfd))
        if kind == "file":
            try:
                st, data = read_file(dfd, name)
            except OSError:  # swapped between stat and open: a change in itself
                return Node("other", *base)
            digest = digest_of(data)
            self._keep(digest, data)
            return Node("file", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, digest)
        if kind == "dir" and shallow:  # a repository: its own entries are fingerprinted
            return Node("dir", *base)
        if kind == "dir":
            children: dict[str, Node] | None = {}
            try:
                fd = os.open(name, O_DIR, dir_fd=dfd)
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


class parent_of:
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
                nxt = os.open(name, O_DIR, dir_fd=fd)
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
