"""An agent's private config copy kept between sessions, and trusted for nothing.

Making a copy is mostly making files: on some disks an inode costs a
millisecond, and a year of use is a few hundred files and directories.  So
a session's copy is not removed at its end but kept (at most :data:`POOL`
per agent, ``<agent>/idle-<session>``), and the next session of that agent
takes one (:func:`claim`: a rename, so that two concurrent sessions never
take the same) and brings it up to date with the host (:class:`Old`, used
by :mod:`.agent_copy`) instead of making it anew.

The copy was the previous session's to write: whatever it left there is
hostile.  Nothing of it is believed but its bytes, compared with the host's:

- :class:`Old` walks it with directory fds, never through a link, and
  removes at once every link, every file with another name (a hard link),
  every socket, fifo or device and every entry not the user's own; the
  directories it keeps are made 0700 again;
- a file the new copy takes from the host is kept only when its size and
  its bytes equal the host's (then its mode is set again); otherwise it is
  rewritten in place (it is a regular file with one name: nothing else sees
  the write);
- everything the new copy does not take is removed (:meth:`Old.prune`), so
  the copy holds what a fresh one would hold, and nothing more;
- a copy that cannot be walked, or holds more than :data:`MAX_ENTRIES`
  entries, is not reused: a fresh one is made (and one the session filled
  with more than twice its files and :data:`SLACK` is not kept at all).

Reading both files to compare them was most of a reuse (Codex's 151 files: ~300
opens and ~1,500 system calls).  So the launcher records, beside the idle copy
and where no session reaches (``<agent>/idle-<session>.ids``, :class:`Record`),
each file it found or made equal to the host's, by both files' identities
(device, inode, size, mtime, ctime), and the next session keeps such a file
unread when neither identity changed.  Sound because the ctime is the kernel's:
any write, truncate, chmod, utime or hard link moves it on to the clock's now,
and nothing unprivileged can set it back; and a file is recorded only when its
ctime is older than a time by the same filesystem's clock: for the host's file,
the copy root's ctime, made or renamed before anything was read; for the copy's,
:func:`.agent_copy.fs_now` once the copy was made, before anything of the session
ran.  A change made later, inside the session or on the host, cannot keep it.
The record is made with the copy and written beside it while the session runs
(where no sandbox reaches; the write-back waits for it), and read before the next
session starts; a record that is missing or malformed, or
names a file whose identity differs, leaves the bytes to decide, as before.  (A
host file on another filesystem whose clock runs behind the state dir's, changed
in the very tick it was read, could be kept stale until it changes again: the
user's own bytes, never the session's.)

Only a copy whose session ended in order is kept (:func:`release`: the
sandbox is gone, the write-back done, and what the session made or changed
in it removed by the write-back, and its logins here); the janitor's removes it.

Standard library only (the janitor imports :mod:`.agent_home`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat

POOL = 2  # idle copies kept per agent: as many concurrent sessions start without a walk
IDLE = "idle-"
IDS = ".ids"  # an idle copy's Record, beside it (agents/<agent>/idle-<session>.ids)
_MAX_RECORD = 8 << 20  # a record larger than this is not read (a copy holds <= 20000 files)
MAX_ENTRIES = 20000  # a copy with more is never walked again, but removed
SLACK = 500  # entries a session may add to its copy (beyond twice its files) and it is kept
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unusable(Exception):
    """The old copy cannot be brought up to date: a fresh one is made instead."""


class Record(dict[str, list[int]]):
    """Per file of a copy (its path in it): the host file's identity and the copy's,
    ``[dev, ino, size, mtime_ns, ctime_ns]`` each, when their bytes were equal."""

    @classmethod
    def parse(cls, data: object) -> Record:
        """A record read back; anything malformed in it is left out (its bytes decide)."""
        if not isinstance(data, dict):
            return cls()
        return cls({k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list)
                    and len(v) == 10 and all(type(i) is int for i in v)})


def take_record(root: str) -> Record:
    """The record :func:`claim` moved beside ``root`` with it, read and removed."""
    path = root + IDS
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return Record()
    try:
        os.unlink(path)
        with os.fdopen(fd, "rb") as fh:
            return Record.parse(json.loads(fh.read(_MAX_RECORD)))
    except (OSError, ValueError):
        return Record()


def claim(parent: str, root: str) -> bool:
    """Take an idle copy of ``parent`` as ``root`` (a rename: concurrent sessions never
    share one); False when there is none (``root`` is then made new by the caller)."""
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(IDLE))
    except OSError:
        return False
    for name in names:
        idle = os.path.join(parent, name)
        try:
            st = os.lstat(idle)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue  # not a copy of ours (a link is never taken, nor written through)
            os.rename(idle, root)
        except OSError:
            continue  # another session took it first
        with contextlib.suppress(OSError):  # its record goes with it (none: bytes decide)
            os.rename(idle + IDS, root + IDS)
        if os.path.samestat(os.lstat(root), st):
            return True
        renew(root)  # replaced meanwhile (the parent is ours alone: never seen)
        return True
    return False


def release(root: str, entries: int, copied: int, logins: tuple[str, ...]) -> None:
    """The session is over (its sandbox gone): keep ``root`` for the next, or remove it.

    ``entries``: how many the write-back found in it, of which the copy made
    ``copied`` files; a copy the session filled with many more (empty
    directories cost the next start a system call each) is removed here, as
    it always was, rather than at the next start.  ``logins`` (paths in it)
    are removed first: a copy at rest holds no login.  Its :class:`Record`
    (:func:`write_record`) goes with it, or is removed with it.
    """
    parent, session = os.path.split(root)
    idle = os.path.join(parent, IDLE + session)
    try:
        idles = [n for n in os.listdir(parent) if n.startswith(IDLE) and not n.endswith(IDS)]
        if entries <= min(MAX_ENTRIES, 2 * copied + SLACK) and len(idles) < POOL:
            for rel in logins:
                _unlink_below(root, rel)
            os.rename(root, idle)
            with contextlib.suppress(OSError):  # none: the next session's bytes decide
                os.rename(root + IDS, idle + IDS)
            return
    except OSError:
        pass
    remove(root)


def remove(root: str) -> None:
    """A copy that is not kept: it and its record."""
    import shutil  # (here: ~2 ms of CPU an agent session's start does not need)

    shutil.rmtree(root, ignore_errors=True)
    for path in (root + IDS, root + ".new" + IDS):
        with contextlib.suppress(OSError):
            os.unlink(path)


def write_record(root: str, record: Record) -> None:
    """``root``'s record, beside it (``<agent>/<session>.ids``, where no session reaches),
    once its copy is made: a file of the copy changed since moves its ctime on, so the
    record needs no update at the session's end."""
    tmp = root + ".new" + IDS
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(record))
    os.replace(tmp, root + IDS)


def _unlink_below(root: str, rel: str) -> None:
    """Remove ``root/rel`` if there, never through a link the session made."""
    *dirs, name = rel.split("/")
    fd = os.open(root, _DIR)
    try:
        for part in dirs:
            sub = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.unlink(name, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass  # not there, or not a file: no login in it
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # a link where a directory was: nothing below it
            raise
    finally:
        os.close(fd)


def renew(root: str) -> None:
    """Make ``root`` an empty directory again (an old copy that could not be reused)."""
    parent, session = os.path.split(root)
    aside = os.path.join(parent, f"gone-{session}")
    os.rename(root, aside)  # whatever its modes: the parent is ours
    os.mkdir(root, 0o700)
    import shutil

    shutil.rmtree(aside, ignore_errors=True)


def unlink_links(names: list[str], dirfd: int) -> None:
    """Remove those of ``names`` (in ``dirfd``) that are links (fwalk lists a link to a
    directory with the directories)."""
    for name in names:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=dirfd)


class Old:
    """What an old copy holds, sanitized: its directories and its plain files, by path."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, os.stat_result] = {}
        self.dirs: set[str] = set()
        self._uid = os.geteuid()
        self._count = 0
        fd = os.open(root, _DIR)
        try:
            self._scan(fd, root)
        finally:
            os.close(fd)

    def _scan(self, dirfd: int, path: str) -> None:
        with os.scandir(dirfd) as it:
            entries = list(it)
        self._count += len(entries)
        if self._count > MAX_ENTRIES:
            raise Unusable(f"more than {MAX_ENTRIES} entries")
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            sub = f"{path}/{entry.name}"
            if stat.S_ISDIR(st.st_mode) and st.st_uid == self._uid:
                if stat.S_IMODE(st.st_mode) != 0o700:  # made unreadable, or open to others
                    os.chmod(entry.name, 0o700, dir_fd=dirfd)
                fd = os.open(entry.name, _DIR, dir_fd=dirfd)
                try:
                    if not os.path.samestat(os.fstat(fd), st):
                        raise Unusable(f"{sub} changed while walked")
                    self.dirs.add(sub)
                    self._scan(fd, sub)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == self._uid:
                self.files[sub] = st
            elif stat.S_ISDIR(st.st_mode):
                raise Unusable(f"{sub} is not the user's")
            else:  # a link, a hard link, a socket, a fifo, a device, a file not ours
                os.unlink(entry.name, dir_fd=dirfd)

    def take(self, path: str) -> os.stat_result | None:
        """The plain file at ``path`` the new copy keeps or rewrites (None: make it)."""
        if path in self.dirs:  # a directory where the host has a file: it goes
            import shutil

            shutil.rmtree(path)
            self.dirs = {d for d in self.dirs if d != path and not d.startswith(path + "/")}
            for f in [f for f in self.files if f.startswith(path + "/")]:
                del self.files[f]
        return self.files.pop(path, None)

    def drop(self, path: str) -> None:
        """A file the new copy does not keep: removed now (its place is made again)."""
        if self.files.pop(path, None) is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def empty(self, path: str) -> None:
        """A file the caller writes anew: emptied and kept (its inode is not made again)."""
        if self.files.pop(path, None) is not None:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                                  | os.O_CLOEXEC))
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def prune(self, made: set[str]) -> int:
        """Remove what the new copy did not take: files, then empty directories not in
        ``made``, deepest first.  How many entries went."""
        gone = 0
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                gone += 1
        self.files.clear()
        for path in sorted(self.dirs, key=lambda d: d.count("/"), reverse=True):
            if path in made:
                continue
            try:
                os.rmdir(path)
                gone += 1
            except OSError:
                pass  # not empty: something of the new copy is below
        return gone


def same(fd: int, out: int, size: int) -> bool:
    """Whether the first ``size`` bytes of ``fd`` and ``out`` are equal (both read whole)."""
    done = 0
    while done < size:
        n = min(1 << 20, size - done)
        a = os.pread(fd, n, done)
        if not a or a != os.pread(out, n, done):
            return False
        done += len(a)
    return True
