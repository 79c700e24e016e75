"""A repository's config that git inside the session can write and the host never runs.

git writes ``.git/config`` by creating ``config.lock`` and renaming it over
``config``; a read-only bind (a mount point) makes that rename fail with
EBUSY, so under bwrap ``git remote add``, ``git config user.email`` or
``git push -u`` failed.  And whatever the session writes there, the host's
own git reads: a ``core.fsmonitor`` set inside runs in a ``git status`` in
another terminal.  Both are solved by keeping two copies per repository and
merging from the session's into the host's by key (:func:`libpolicy.hostrun.
merge_config`: only keys that cannot run anything pass, the rest is kept in
the quarantine with one line).

bwrap (``swap``): for the session, ``.git/config`` becomes a symlink to the
absolute path ``LIVE/host/N/config`` in the user's state directory; the
sandbox gets the private directory ``LIVE/inside/N`` bound read-write onto
``LIVE/host/N``.  git's lockfile code follows a symlink at ``config``
(lockfile.c, resolve_symlink), so the lock and rename happen beside the
target: on the host that is the host's copy, inside it is the session's.
Host git never reads a byte the session wrote; the session's writes work.
The launcher merges the allowed keys into the host's copy as they are
written (:mod:`.hostrun_live`) and at the end, and puts a regular file
with the original's mode back on every exit path (the janitor's too).

Landlock (no mount namespace): ``.git/config`` stays a regular file that
the session writes; the watcher (:mod:`.hostrun_live`) merges each change
against the last accepted version at once, rewriting the file without the
forbidden keys under git's own ``config.lock``, and the end merges by key
instead of restoring the whole file.

Nothing is lost if everything dies: the original of every config is saved
first in ``LIVE/saved/N`` (fsynced), with ``record.json`` naming it, before
anything changes; :func:`repair` (run by every ``agent-sandbox`` start and by
``doctor``) turns any symlink left by a dead session back into a file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Mapping

from libbroker.launcher.hostrun_files import O_DIR, put_in_place, read_at, read_small, replace
from libbroker.launcher.hostrun_fingerprint import Node, Snapshot, digest_of
from libbroker.launcher.hostrun_fingerprint import parent_of as _parent
from libbroker.launcher.hostrun_fs import Chain, parent_in, remove_tree
from libbroker.launcher.hostrun_gitmerge import (
    LiveConfigs,
    Repo,
    neutralize,
    quarantine_lines,
    sync,
)
from libbroker.launcher.hostrun_sweep import state_dir
from libbroker.shellquote import quote, shown

LIVE = "live"  # under the state dir: one directory per session
POINTER = "hostrun-live"  # in the runtime dir: the session's live dir, for the janitor
DONE = ".done-"  # a finished session's live dir, set aside for removal (remove_set_aside)


def start(snap: Snapshot, state: str, runtime_dir: str, *, swap: bool) -> LiveConfigs:
    """Save every repository's config, make the copies, and (``swap``) put the symlinks in.

    Only repositories whose config was a regular file at the scan are taken;
    the rest stays the sweep's.  The record and the saved originals are on
    disk before any ``.git/config`` changes.
    """
    live = os.path.join(state, LIVE, snap.session)
    os.makedirs(live, mode=0o700, exist_ok=True)
    out = LiveConfigs(snap.workdir, live, snap.session)
    out._lock = os.open(os.path.join(live, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(out._lock, fcntl.LOCK_EX)  # held while the launcher lives: not a leftover
    if runtime_dir:
        with open(os.path.join(runtime_dir, POINTER), "w") as fh:
            fh.write(live)
    root = os.open(snap.workdir, O_DIR)
    try:
        for n, git in enumerate(sorted(snap.repos)):
            recorded = snap.entries.get(f"{git}/config", ("", None))[1]
            if recorded is None or recorded.kind != "file":
                continue
            with _parent(root, f"{git}/config") as (gfd, name):
                data = read_small(gfd, name) if gfd >= 0 else None
                if data is None:
                    continue  # too big or gone: the sweep's, as before
                repo = Repo(git, n, stat.S_IMODE(recorded.mode))
                _save(out, repo, gfd, name, data)
            _copies(out, repo, data, swap)
            out.repos.append(repo)
        if out.repos:  # the saved originals' names, on disk before any swap
            saved = os.open(os.path.join(live, "saved"), O_DIR)
            try:
                os.fsync(saved)
            finally:
                os.close(saved)
        out._record()
        if swap:
            for repo in out.repos:
                _swap_in(out, root, repo)
            out._record()
    finally:
        os.close(root)
    return out


def _save(live: LiveConfigs, repo: Repo, gfd: int, name: str, data: bytes) -> None:
    """saved/N: the original itself, hard-linked (its bytes are on disk already: nothing
    to write or fsync); a copy, fsynced, where the state dir is on another filesystem."""
    os.makedirs(os.path.join(live.live, "saved"), mode=0o700, exist_ok=True)
    saved = os.open(os.path.join(live.live, "saved"), O_DIR)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(repo.n), dir_fd=saved)
        try:
            os.link(name, str(repo.n), src_dir_fd=gfd, dst_dir_fd=saved, follow_symlinks=False)
            if read_small(saved, str(repo.n)) == data:
                return
            os.unlink(str(repo.n), dir_fd=saved)  # replaced meanwhile: the bytes read are kept
        except OSError:
            pass  # EXDEV, EPERM (protected_hardlinks), ...
        replace(saved, str(repo.n), data, 0o600, sync=True)
    finally:
        os.close(saved)


def _copies(live: LiveConfigs, repo: Repo, data: bytes, swap: bool) -> None:
    """host/N/config and (bwrap) inside/N/config, from the original's bytes."""
    os.makedirs(os.path.join(live.live, "host"), mode=0o700, exist_ok=True)
    dirs = [live.host_dir(repo)] + ([live.inside_dir(repo)] if swap else [])
    for path in dirs:
        os.makedirs(path, mode=0o700, exist_ok=True)
        dfd = os.open(path, O_DIR)
        try:
            replace(dfd, "config", data, repo.mode)
        finally:
            os.close(dfd)


def _swap_in(live: LiveConfigs, root: int, repo: Repo) -> None:
    target = os.path.join(live.host_dir(repo), "config")
    with _parent(root, repo.rel) as (gfd, name):
        if gfd < 0:
            return
        tmp = ".config.agent-sandbox-link"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=gfd)
        os.symlink(target, tmp, dir_fd=gfd)
        os.rename(tmp, name, src_dir_fd=gfd, dst_dir_fd=gfd)
        repo.swapped = True


# --- merging: the session's keys into the host's copy ---------------------------------

def finish(live: LiveConfigs, snap: Snapshot | None,
           under: Mapping[str, int] | None = None,
           unwritten: frozenset[str] = frozenset()) -> list[str]:
    """Merge a last time, put regular files back, and tell the sweep they are accepted.

    Run once nothing of the session is alive, before the sweep.  A config
    the session replaced by something else (it cannot under bwrap: the
    watcher puts the link back) is left to the sweep, which restores the
    original.  ``under``: git dir -> an fd on it beneath the live gate's
    bind (:attr:`.hostrun_binds.Binds.under`): the launcher's own opens there
    do not wait on the gate, and the exchange with the host's copy is not
    across mounts.  ``unwritten``: configs whose private copy the watcher saw no
    write to (no last merge needed).
    """
    under = under or {}
    # From the workdir beneath the gate's binds where there are some (an open by the
    # launcher through them would wait on the gate's thread).
    root = os.dup(under[""]) if "" in under else os.open(live.workdir, O_DIR)
    chain = Chain(root)  # one chain of directory fds for all: the repositories share paths
    try:
        for repo in sorted(live.repos, key=lambda r: r.git):
            try:
                final = _finish_one(live, chain, repo, under.get(repo.git, -1),
                                    repo.rel not in unwritten)
            except OSError as exc:
                live.lines.append(f"agent-sandbox: {shown(repo.rel)} [git-config]: could not be "
                                  f"merged back: {exc.strerror or exc}; the original is in "
                                  f"{quote(os.path.join(live.live, 'saved', str(repo.n)))}")
                continue
            if final is not None and snap is not None:
                accept(snap, repo.rel, *final)
    finally:
        chain.close()
        os.close(root)
    lines = live.lines + quarantine_lines(live)
    live.lines = []
    if not any("could not be merged back" in line for line in lines):
        _set_aside(live.live)
    live.close()
    return lines


def _finish_one(live: LiveConfigs, chain: Chain, repo: Repo, under: int, merge: bool
                ) -> tuple[bytes, int, os.stat_result | None] | None:
    """The config's final bytes, written in place, its mode and (when the launcher wrote it
    last) its stat; None when the sweep must judge it.  ``under``: an fd on the git dir
    beneath the gate's bind, or -1."""
    if under >= 0:
        return _finish_in(live, repo, under, "config", merge)
    with parent_in(chain, repo.rel) as (gfd, name):
        return _finish_in(live, repo, gfd, name, merge)


def _finish_in(live: LiveConfigs, repo: Repo, gfd: int, name: str, merge: bool
               ) -> tuple[bytes, int, os.stat_result | None] | None:
    if gfd < 0:
        return None
    ours = os.path.join(live.host_dir(repo), "config")
    try:
        linked = os.readlink(name, dir_fd=gfd) == ours
    except OSError:
        linked = False
    if not linked:
        if repo.swapped:
            return None  # something else took the link's place: the sweep's
        neutralize(live, repo)  # Landlock (or a start killed before its swap)
        data = read_small(gfd, name)
        return None if data is None else (data, repo.mode, None)
    if merge:
        sync(live, repo)
    final = read_at(live.host_dir(repo), "config")
    st = (put_in_place(live.host_dir(repo), gfd, name, final, repo.mode)
          if final is not None else None)
    if final is None:
        final = read_at(os.path.join(live.live, "saved"), str(repo.n))
    if final is None:
        return None
    if st is None:
        replace(gfd, name, final, repo.mode)
        st = os.stat(name, dir_fd=gfd, follow_symlinks=False)
    repo.swapped = False
    live.restored.append(repo.rel)
    return final, repo.mode, st


def _set_aside(path: str) -> None:
    """A finished live dir out of the way in one rename (a directory per repository costs
    a millisecond each to remove on a busy disk): :func:`remove_set_aside`, in the next
    start's scan thread, removes it; it holds nothing the person needs any more."""
    parent, base = os.path.split(path)
    try:  # os.urandom, not secrets: importing secrets (hmac, random) cost up to 9 ms
        os.rename(path, os.path.join(parent, f"{DONE}{base}-{os.urandom(4).hex()}"))
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def remove_set_aside(state: str) -> None:
    """Remove the live dirs finished sessions set aside (every start, off its critical path)."""
    try:
        dfd = os.open(os.path.join(state, LIVE), O_DIR)
    except OSError:
        return
    try:  # hostrun_fs's removal, not shutil's (whose import costs ~3 ms of CPU at each start)
        for name in [n for n in os.listdir(dfd) if n.startswith(DONE)]:
            with contextlib.suppress(OSError):
                remove_tree(dfd, name)
    finally:
        os.close(dfd)


def accept(snap: Snapshot, rel: str, data: bytes, mode: int,
           st: os.stat_result | None = None) -> None:
    """Record ``data`` as the entry's state: the sweep keeps it (the merged config).

    ``st``: the file's stat, when the launcher itself wrote it just now (nothing of the
    session is alive): the sweep then knows it by its stat, as the scan's, and reads no
    byte of it; else (0 for the inode) the sweep compares its bytes."""
    digest = digest_of(data)  # the snapshot's key for these bytes, as the scan's
    rule = snap.entries.get(rel, ("git-config", None))[0]
    snap.blobs[digest] = data
    if st is not None and st.st_size == len(data) and stat.S_IMODE(st.st_mode) == mode:
        snap.entries[rel] = (rule, Node.of(st, digest=digest))
        return
    snap.entries[rel] = (rule, Node("file", stat.S_IFREG | mode, len(data), time.time_ns(), 0,
                                    digest))


def repair(state: str = "") -> list[str]:
    """Turn back into regular files the symlinks left by sessions no one runs any more.

    A session's live dir is left when its launcher and janitor both died (a
    reboot, an OOM kill of both).  Its links still point at the host's copy,
    so git works meanwhile; this puts the files back (the host's copy, else
    the saved original) and removes the dir.  A live dir whose lock is held
    belongs to a running session and is left alone.
    """
    base = os.path.join(state or state_dir(), LIVE)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    lines = []
    for name in sorted(names):
        if not name.startswith(DONE):  # finished: remove_set_aside's
            lines += _repair_one(os.path.join(base, name))
    return lines


def _repair_one(path: str) -> list[str]:
    try:
        lock = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return []  # a live session's
            raise
        live = LiveConfigs.load(path)
        if live is None:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            return []
        if not os.path.isdir(live.workdir):
            # Its workdir is gone (a worktree removed, a temporary directory
            # deleted): nothing to put back there, and every later session
            # would stop here.  Said once, then the record goes.
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            return [f"agent-sandbox: {shown(live.workdir)}: gone since a session ended there "
                    "without putting its git configs back; nothing left to repair"]
        lines = finish(live, None)
        return [*lines, *(f"agent-sandbox: {shown(os.path.join(live.workdir, rel))}: a regular "
                          "file again (a session ended without putting it back)"
                          for rel in live.restored)]
    finally:
        os.close(lock)


def janitor_finish(runtime_dir: str) -> list[str]:
    """The janitor's end, before its sweep: files back, the merged ones accepted in the
    snapshot the sweep reads."""
    try:
        with open(os.path.join(runtime_dir, POINTER)) as fh:
            path = fh.read()
    except OSError:
        return []
    live = LiveConfigs.load(path)
    if live is None:
        return []
    live._lock = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(live._lock, fcntl.LOCK_EX)  # a start's repair() leaves it to us meanwhile
    from libbroker.launcher.hostrun_scan import SNAPSHOT, load

    snap = load(runtime_dir)
    lines = finish(live, snap)
    if snap is not None:
        target = os.path.join(runtime_dir, SNAPSHOT)
        with open(target + ".tmp", "w") as fh:
            fh.write(snap.to_json())
        os.rename(target + ".tmp", target)
    return lines
