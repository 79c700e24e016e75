"""The live gate's record of its binds, for whoever unbinds them when the launcher cannot.

One file per session, ``binds.json`` in its runtime dir, written *before*
each mount (:mod:`.hostrun_binds`) and held locked (``flock``) by the
launcher for as long as its gate lives.  Its readers:

- the janitor, once the launcher died (the lock went with it);
- when the janitor died too (both killed: an OOM kill, a ``kill -9`` of the
  whole group), the next ``agent-sandbox`` start or ``doctor``, which looks
  at every runtime dir of this user and takes the records no live launcher
  holds locked (:func:`take`).

Appended lines of JSON, ``[path, mount id, ids there before]`` (id -1: about
to mount), the last line for a path winning: no rename, so the lock stays on
the one file, and nothing is fsynced (mounts do not outlive a reboot).  A
record is believed only in a directory and a file that are ours and not
links: as root, another user's ``/tmp/agent-sandbox-*`` is never read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time

RECORD = "binds.json"
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Made = tuple[str, int, list[int]]  # (mount point, our mount's id or -1, the ids there before)


class Record:
    """The launcher's side: created and locked at once, one line per step."""

    def __init__(self, record_dir: str) -> None:
        self.path = os.path.join(record_dir, RECORD)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                          | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # ours alone until the launcher's end or death

    def write(self, made: Made) -> None:
        os.write(self.fd, (json.dumps(list(made)) + "\n").encode())

    def close(self, *, remove: bool) -> None:
        """``remove``: everything was unbound; else it stays for the janitor or a start."""
        if self.fd < 0:
            return
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


def parse(data: bytes) -> list[Made]:
    """The binds a record names, in the order first named; a torn last line is skipped.
    (The format before the lines: one object ``{"made": [...]}``.)"""
    rows: list[object] = []
    if data.lstrip().startswith(b"{"):
        with contextlib.suppress(ValueError, AttributeError):
            rows = list(json.loads(data).get("made", []))
    else:
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    out: dict[str, Made] = {}
    for row in rows:
        if not isinstance(row, list) or len(row) != 3 or not isinstance(row[2], list):
            continue
        with contextlib.suppress(ValueError, TypeError):
            out[str(row[0])] = (str(row[0]), int(row[1]), [int(b) for b in row[2]])
    return list(out.values())


def take(session_dir: str, *, wait: float = 0.0) -> tuple[int, list[Made]] | None:
    """A session dir's record: ``(fd, binds)`` with the record locked by us (its launcher
    is gone: the caller unbinds, then :func:`drop` or closes ``fd``), ``(-1, binds)``
    when a live launcher holds it (after ``wait`` seconds), None without one of ours."""
    try:
        dfd = os.open(session_dir, _O_DIR)
    except OSError:
        return None
    try:
        if os.fstat(dfd).st_uid != os.geteuid():
            return None
        try:
            fd = os.open(RECORD, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > 1 << 20:
            os.close(fd)
            return None
        locked = _lock(fd, wait)
        data = os.pread(fd, st.st_size + 4096, 0)
    except OSError:
        os.close(fd)
        return None
    if not locked or data.lstrip().startswith(b"{"):
        # A live launcher's; or one written before the lock (an older version's session,
        # maybe still running): left to its own janitor.
        os.close(fd)
        return -1, parse(data)
    return fd, parse(data)


def drop(session_dir: str, fd: int) -> None:
    """The record taken with ``fd`` is done with: removed, and its lock let go."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(session_dir, RECORD))
    os.close(fd)


def _lock(fd: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
