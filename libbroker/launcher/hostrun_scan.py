"""The host-run guard's scan, at session start: fingerprint every host-run entry.

:func:`scan` finds every git directory at any depth and every tree entry
(:mod:`.hostrun_walk`), and fingerprints each existing entry
(:mod:`.hostrun_fingerprint`): files up to
:data:`~.hostrun_fingerprint.SMALL` bytes are kept in the snapshot, bigger
ones saved (a reflink where the filesystem allows, else their data segments)
under the state dir's ``quarantine/<session>.originals/``, which no
teardown removes.  It also records which git entries are missing, and where
the existing gitlinks point.  The snapshot itself lives in the session's
runtime dir, which the sandbox sees read-only, so the janitor can sweep after
a ``kill -9`` (:func:`load`).
"""

from __future__ import annotations

import os
import time

from libbroker.launcher.hostrun_fingerprint import Looker, Snapshot
from libbroker.launcher.hostrun_fs import O_DIR, O_FILE, join, open_dir, parent_of
from libbroker.launcher.hostrun_walk import Walk, git_entries
from libpolicy.hostrun import Table

SNAPSHOT = "hostrun.json"  # in the runtime dir
_REALTIME_COARSE = 5  # linux/time.h; not in Python's time module
ORIGINALS = ".originals"  # beside the session's quarantine dir: saved copies of big files


def session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def quarantine_dir(state: str, session: str) -> str:
    return os.path.join(state, "quarantine", session)


def scan(workdir: str, table: Table, *, session: str = "", runtime_dir: str = "",
         state: str = "") -> Snapshot:
    """Find every repository and host-run entry in ``workdir``; fingerprint each.

    With ``runtime_dir``, the snapshot is written there for the janitor; with
    ``state``, files bigger than SMALL are saved under it (without, they are
    judged by their inode, size and times alone: tests).
    """
    start = time.monotonic()
    snap = Snapshot(workdir, session or session_id(), table)
    if state:
        snap.saved = quarantine_dir(state, snap.session) + ORIGINALS
    looker = Looker(snap)
    root = os.open(workdir, O_DIR)
    walk = Walk(table)
    try:
        walk.run(root)
        snap.dirs = walk.dirs
        for rel, ino in walk.git_dirs:
            snap.repos[rel] = ino
            _git_entries(snap, looker, root, rel)
        for rel, entry in walk.found:
            with parent_of(root, rel) as (pfd, name):
                if pfd >= 0:
                    node = looker.node(pfd, name, shallow=entry.rule == "git-dir")
                    snap.entries[rel] = (entry.rule, node)
        for rel in list(snap.repos):
            _config_targets(snap, looker, root, rel)
        from libbroker.launcher.hostrun_newrepo import outside_targets

        snap.targets = outside_targets(root, walk)
    finally:
        os.close(root)
    snap.finished = time.time_ns()
    settle(snap)
    snap.seconds = time.monotonic() - start
    if runtime_dir:
        path = os.path.join(runtime_dir, SNAPSHOT)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(snap.to_json())
        os.rename(path + ".tmp", path)
    return snap


def _git_entries(snap: Snapshot, looker: Looker, root: int, rel: str) -> None:
    """The held entries of the git dir ``rel``: hooks/, config, commondir, state dirs."""
    with parent_of(root, rel) as (pfd, name):
        try:
            # "": the root is the git dir (gitdir_guard)
            gfd = open_dir(pfd, name or ".") if pfd >= 0 else -1
        except OSError:
            return  # unreadable now: the sweep moves what it cannot read aside
        if gfd < 0:
            return
        try:
            for entry in git_entries(snap.table):
                key = join(rel, entry.parts[0])
                snap.entries[key] = (entry.rule, looker.node(gfd, entry.parts[0]))
        finally:
            os.close(gfd)


def _config_targets(snap: Snapshot, looker: Looker, root: int, rel: str) -> None:
    """What a repository's own config makes git read or run, inside the workdir, is held
    like the table's entries: core.hooksPath (husky's ``.husky/``) and include.path /
    includeIf targets (a shared ``tools/git.cfg``), as :func:`libpolicy.gitconfig.
    config_targets` names them."""
    from libpolicy.gitconfig import config_targets

    node = snap.entries.get(join(rel, "config"), ("", None))[1]
    data = snap.blobs.get(node.digest) if node is not None and node.kind == "file" else None
    if data is None:
        return
    git_dir = os.path.join(snap.workdir, rel)
    top = os.path.dirname(git_dir) if rel == ".git" or rel.endswith("/.git") else None
    for path in config_targets(data, git_dir, top) or ():
        inside = os.path.normpath(path)
        if not inside.startswith(snap.workdir.rstrip("/") + "/"):
            continue  # outside the workdir: not the session's to write
        target = inside[len(snap.workdir.rstrip("/")) + 1:]
        if target in snap.entries or target.split("/")[0] == "..":
            continue
        with parent_of(root, target) as (pfd, name):
            if pfd >= 0:
                snap.entries[target] = ("git-config-target", looker.node(pfd, name))


def settle(snap: Snapshot) -> None:
    """Return once the clock has moved on from the scan's end by a tick of ctime's clock.

    The sweep takes an entry whose ctime is unchanged as unchanged: nothing
    the session does may share the last tick the scan saw (file times come
    from the coarse clock, a few ms).
    """
    try:
        tick = time.clock_getres(_REALTIME_COARSE)
    except OSError:
        tick = 0.01
    wait = snap.finished + int(tick * 1e9) * 2 - time.time_ns()
    if wait > 0:
        time.sleep(wait / 1e9)


def load(runtime_dir: str) -> Snapshot | None:
    """The snapshot the scan left in ``runtime_dir``, if any."""
    try:
        fd = os.open(os.path.join(runtime_dir, SNAPSHOT), O_FILE)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return Snapshot.from_json(fh.read())
