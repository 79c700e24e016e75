"""The host-run guard's file primitives: a tree the agent controlled, looked at safely.

Every lookup is one name relative to a directory fd, never through a link
(``O_NOFOLLOW``; ``O_DIRECTORY`` for directories).  Trees are walked with an
explicit stack and a bounded number of open fds (:class:`Chain`): a tree of
any depth costs neither recursion nor more than :data:`MAX_OPEN` fds.  As the
owner the launcher may give itself back what the agent took away (a
``chmod 0311 .git``): :func:`open_dir` and :func:`open_file` add the owner's
bits and retry once.  File contents are hashed and copied by their data
segments (``SEEK_DATA``/``SEEK_HOLE``): a 1 TiB sparse file costs its data,
in bounded memory; a copy is a reflink (``FICLONE``) where the filesystem
allows one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Callable, Iterator

# sha256 from its own C module: hashlib would load OpenSSL's _hashlib and _blake2
# too (~2.5 ms of CPU, in the scan's thread while the launcher starts).  A Python
# built without its own hashes (OpenSSL's alone) has only hashlib's.  (Typed as
# hashlib's: typeshed has no stub for the C modules.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from hashlib import sha256 as sha256
else:
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256
        else:
            from _sha256 import sha256
    except ImportError:  # such builds only
        from hashlib import sha256

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_OPEN = 48  # directory fds a Chain holds; deeper ones are reopened by name
CHUNK = 1 << 20  # bytes read at a time
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
MAX_RETRIES = 1000  # directories found not empty again while removing a tree


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def give_owner(dfd: int, name: str, bits: int) -> bool:
    """Add ``bits`` to ``name``'s mode when this process owns it (never through a link).

    The chmod goes through an ``O_PATH`` fd's /proc link, so it applies to
    the very inode looked at.  False when not ours, a link, or already set.
    """
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
            return False
        mode = stat.S_IMODE(st.st_mode)
        if mode & bits == bits:
            return False
        os.chmod(f"/proc/self/fd/{fd}", mode | bits)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def open_dir(dfd: int, name: str, *, fix: bool = False) -> int:
    """``name`` in ``dfd`` as a directory fd; with ``fix``, u+rwx added once if refused."""
    try:
        return os.open(name, O_DIR, dir_fd=dfd)
    except PermissionError:
        if not fix or not give_owner(dfd, name, 0o700):
            raise
        return os.open(name, O_DIR, dir_fd=dfd)


def open_file(dfd: int, name: str, *, fix: bool = False) -> int:
    """``name`` in ``dfd`` opened for reading; with ``fix``, u+r added once if refused."""
    try:
        return os.open(name, O_FILE, dir_fd=dfd)
    except PermissionError:
        if not fix or not give_owner(dfd, name, 0o400):
            raise
        return os.open(name, O_FILE, dir_fd=dfd)


class Chain:
    """Directory fds along one path below ``root``, for a depth-first walk of any depth.

    :meth:`fd` returns the fd of a directory given by its names below the
    root.  The fds of the current path's deepest :data:`MAX_OPEN` directories
    are held, so a step down, up or aside opens at most one directory; a
    directory above the held ones is reopened name by name from the root
    (``O_NOFOLLOW`` each), which a depth-first walk needs once per
    :data:`MAX_OPEN` levels climbed.  The fd is borrowed: valid until the
    next call or :meth:`close`.
    """

    def __init__(self, root: int, *, fix: bool = False) -> None:
        self.root = root
        self.fix = fix
        self.path: tuple[str, ...] = ()  # the directory of the deepest fd held
        self.fds: list[int] = []  # the fds of path's last len(fds) directories

    def fd(self, parts: tuple[str, ...]) -> int:
        path, fds = self.path, self.fds
        common = _common(path, parts)
        while len(path) > common and fds:  # what is not on the way down is closed
            os.close(fds.pop())
            path = path[:-1]
        if not fds:  # every fd held was below the way: from the root again
            path = ()
        self.path = path
        fd = fds[-1] if fds else self.root
        for name in parts[len(path):]:
            fd = open_dir(fd, name, fix=self.fix)
            fds.append(fd)
            self.path = path = (*path, name)
            if len(fds) > MAX_OPEN:
                os.close(fds.pop(0))
        return fd

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())
        self.path = ()

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """The length of the common start of ``a`` and ``b``."""
    if a[: len(b)] == b:
        return len(b)
    if b[: len(a)] == a:
        return len(a)
    n = min(len(a), len(b)) - 1
    while n > 0 and a[:n] != b[:n]:
        n -= 1
    return n


def segments(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(offset, length)`` of each data segment of the file ``fd`` (holes skipped)."""
    off = 0
    while off < size:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            data, hole = off, size  # no SEEK_DATA here: all of it is data
        hole = min(hole, size)
        if hole > data:
            yield data, hole - data
        off = max(hole, data + 1)


def hash_fd(fd: int) -> str:
    """sha256 over the file's data segments and their offsets, and its size.

    Streaming, in :data:`CHUNK`-sized reads.  Equal bytes laid out in other
    holes hash differently: at worst an unchanged file counts as changed.
    """
    import struct

    size = os.fstat(fd).st_size
    h = sha256()
    for offset, length in segments(fd, size):
        h.update(struct.pack("<QQ", offset, length))
        while length > 0:
            chunk = os.pread(fd, min(length, CHUNK), offset)
            if not chunk:
                break
            h.update(chunk)
            offset += len(chunk)
            length -= len(chunk)
    h.update(struct.pack("<Q", size))
    return h.hexdigest()


def clone_into(src: int, dst: int) -> None:
    """The bytes of ``src`` into the empty file ``dst``: a reflink, else its data segments."""
    import fcntl

    try:
        fcntl.ioctl(dst, FICLONE, src)
        return
    except OSError:
        pass  # another filesystem, or none that shares extents: copy the data
    size = os.fstat(src).st_size
    for offset, length in segments(src, size):
        done = 0
        while done < length:
            n = _copy_range(src, dst, offset + done, length - done)
            if n == 0:
                break
            done += n
    os.ftruncate(dst, size)


def _copy_range(src: int, dst: int, offset: int, length: int) -> int:
    try:
        return os.copy_file_range(src, dst, min(length, 1 << 30), offset, offset)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    data = os.pread(src, min(length, CHUNK), offset)
    view = memoryview(data)
    at = offset
    while view:
        n = os.pwrite(dst, view, at)
        view, at = view[n:], at + n
    return len(data)


def copy_tree(sfd: int, name: str, dfd: int, dname: str) -> None:
    """Copy ``name`` to ``dname`` as it is (a link as a link; fifos and devices not at all).

    Iterative, with bounded fds: a tree of any depth (across filesystems).
    """
    _copy_one(sfd, name, dfd, dname)
    stack: list[tuple[str, ...]] = [()]
    with Chain(sfd, fix=True) as src, Chain(dfd) as dst:
        while stack:
            parts = stack.pop()
            try:
                sdir = src.fd((name, *parts))
            except NotADirectoryError:
                continue
            names = sorted(os.listdir(sdir))
            ddir = dst.fd((dname, *parts))
            sdir = src.fd((name, *parts))
            for child in names:
                if _copy_one(sdir, child, ddir, child):
                    stack.append((*parts, child))


def _copy_one(sfd: int, name: str, dfd: int, dname: str) -> bool:
    """One entry; True for a directory (made empty, to be filled)."""
    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=sfd), dname, dir_fd=dfd)
    elif stat.S_ISREG(st.st_mode):
        src = open_file(sfd, name, fix=True)
        try:
            dst = os.open(dname, O_NEW, 0o600, dir_fd=dfd)
            try:
                clone_into(src, dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dname, 0o700, dir_fd=dfd)
        return True
    return False


def remove_path(path: str) -> None:
    """:func:`remove_tree` of the last component of ``path``, from its parent opened
    without following a link there; OSError if the parent does not open."""
    parent, name = os.path.split(path)
    dfd = os.open(parent, O_DIR)
    try:
        remove_tree(dfd, name)
    finally:
        os.close(dfd)


def remove_tree(dfd: int, name: str) -> None:
    """Remove ``name`` and all beneath it, never through a link; iterative, bounded fds.

    What the agent made unwritable to its owner is made writable first.
    """
    try:
        os.unlink(name, dir_fd=dfd)
        return
    except IsADirectoryError:
        pass
    stack: list[tuple[str, ...]] = [(name,)]
    retries = 0
    with Chain(dfd, fix=True) as chain:
        while stack:
            parts = stack[-1]
            fd = chain.fd(parts)
            subdirs = []
            for item in os.scandir(fd):
                if item.is_dir(follow_symlinks=False):
                    subdirs.append((*parts, item.name))
                else:
                    _as_owner(fd, os.unlink, item.name)
            if subdirs:
                stack += subdirs
                continue
            try:
                _as_owner(chain.fd(parts[:-1]), os.rmdir, parts[-1])
            except OSError as exc:  # something appeared meanwhile (a live session): again
                retries += 1
                if exc.errno != errno.ENOTEMPTY or retries > MAX_RETRIES:
                    raise
                continue
            stack.pop()


def _as_owner(dfd: int, remove: Callable[..., None], name: str) -> None:
    """``remove(name)`` in ``dfd``; refused, once more with the owner's bits on ``dfd``."""
    try:
        remove(name, dir_fd=dfd)
    except PermissionError:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise
        os.fchmod(dfd, stat.S_IMODE(st.st_mode) | 0o700)
        remove(name, dir_fd=dfd)


class parent_of:
    """The directory fd holding ``rel``'s last name, walked one name at a time (no link).

    Yields ``(-1, name)`` when a directory on the way is missing, a link or
    not a directory: nothing below it is reached through it.
    """

    def __init__(self, root: int, rel: str, *, fix: bool = False) -> None:
        self.parts = tuple(rel.split("/"))
        self.chain = Chain(root, fix=fix)

    def __enter__(self) -> tuple[int, str]:
        try:
            return self.chain.fd(self.parts[:-1]), self.parts[-1]
        except OSError:
            return -1, self.parts[-1]

    def __exit__(self, *_: object) -> None:
        self.chain.close()


class parent_in(parent_of):
    """:class:`parent_of` through a chain the caller keeps from one path to the next (a
    loop over many entries opens only what differs); the chain stays open."""

    def __init__(self, chain: Chain, rel: str) -> None:
        self.parts = tuple(rel.split("/"))
        self.chain = chain

    def __exit__(self, *_: object) -> None:
        pass


def make_dirs(top: int, top_path: str, parts: list[str]) -> tuple[int, str]:
    """The directory ``parts`` below ``top`` (its path ``top_path``), each made 0700 if
    missing: its fd (the caller's) and path.  A name already taken by something that is
    not a directory (a link moved aside there earlier) is made beside it as ``name.N``."""
    fd, path = os.dup(top), top_path
    try:
        for part in parts:
            name, n = part, 0
            while True:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    nxt = os.open(name, O_DIR, dir_fd=fd)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                n += 1
                name = f"{part}.{n}"
            os.close(fd)
            fd, path = nxt, os.path.join(path, name)
    except BaseException:
        os.close(fd)
        raise
    return fd, path
