"""The host-run guard's scan, at session start: fingerprint every host-run entry.

:func:`scan` finds every repository at any depth (:mod:`.hostrun_walk`) and
fingerprints every existing entry (:mod:`.hostrun_fingerprint`): files up to
:data:`~.hostrun_fingerprint.SMALL` bytes are kept in the snapshot, bigger
ones copied into the runtime dir.  It also records which git entries are
missing.  The snapshot lives in the session's runtime dir, which the sandbox
sees read-only, so the janitor can sweep after a ``kill -9`` (:func:`load`).
"""

from __future__ import annotations

import os
import time

from libbroker.launcher.hostrun_fingerprint import (
    O_DIR,
    O_FILE,
    Looker,
    Snapshot,
    join,
    parent_of,
)
from libbroker.launcher.hostrun_walk import Walk
from libpolicy.hostrun import Table

SNAPSHOT = "hostrun.json"  # in the runtime dir
COPIES = "hostrun-copies"  # in the runtime dir: contents bigger than SMALL


def session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def scan(workdir: str, table: Table, *, session: str = "", runtime_dir: str = "") -> Snapshot:
    """Find every repository and host-run entry in ``workdir``; fingerprint each.

    With ``runtime_dir``, the snapshot is written there for the janitor (and
    contents bigger than :data:`SMALL` copied beside it).
    """
    start = time.monotonic()
    snap = Snapshot(workdir, session or session_id(), table)
    looker = Looker(snap, os.path.join(runtime_dir, COPIES) if runtime_dir else "")
    root = os.open(workdir, O_DIR)
    walk = Walk(table)
    try:
        walk.run(root)
        for rel, ino in walk.git_dirs:
            snap.repos[rel] = ino
            with parent_of(root, rel) as (pfd, name):
                if pfd < 0:
                    continue
                gfd = os.open(name or ".", O_DIR, dir_fd=pfd)  # "": the root is the git dir
                try:
                    for entry in table.git:
                        key = join(rel, entry.parts[0])
                        snap.entries[key] = (entry.rule, looker.node(gfd, entry.parts[0]))
                finally:
                    os.close(gfd)
        for rel, entry in walk.found:
            with parent_of(root, rel) as (pfd, name):
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


def load(runtime_dir: str) -> Snapshot | None:
    """The snapshot the scan left in ``runtime_dir``, if any."""
    try:
        fd = os.open(os.path.join(runtime_dir, SNAPSHOT), O_FILE)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return Snapshot.from_json(fh.read())
