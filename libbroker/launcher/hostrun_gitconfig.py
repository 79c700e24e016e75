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
import json
import os
import stat
import time

from libbroker.launcher.hostrun_fingerprint import Node, Snapshot
from libbroker.launcher.hostrun_fingerprint import parent_of as _parent
from libbroker.launcher.hostrun_sweep import state_dir
from libbroker.shellquote import quote, shown

LIVE = "live"  # under the state dir: one directory per session
RECORD = "record.json"
POINTER = "hostrun-live"  # in the runtime dir: the session's live dir, for the janitor
# A config beyond this is not merged (the session's is refused whole; an original that
# big keeps the old read-only hold): the pure parser takes about 1 s per MiB, and a
# hostile file must not hold the live guard up (a real one is a few KiB).
MAX_CONFIG = 256 << 10
_NOT_A_CONFIG = f"(not a regular file of at most {MAX_CONFIG >> 10} KiB)"
LOCK_WAIT = 0.2  # seconds a config.lock may be held before it counts as stale
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def read_small(dfd: int, name: str, limit: int = MAX_CONFIG) -> bytes | None:
    """The bytes of the regular file ``name`` in ``dfd``; None if it is not one or too big."""
    try:
        fd = os.open(name, _FILE, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return None if len(data) > limit else data
    finally:
        os.close(fd)


def write_new(dfd: int, name: str, data: bytes, mode: int, *, sync: bool = False) -> None:
    """Create ``name`` in ``dfd`` (it must not exist) holding ``data`` with ``mode``."""
    fd = os.open(name, _NEW, 0o600, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace(dfd: int, name: str, data: bytes, mode: int, *, tmp: str = "",
            sync: bool = False) -> None:
    """Atomically make ``name`` in ``dfd`` a regular file holding ``data`` (a link is replaced,
    never followed).  ``tmp``: the name written first (``config.lock``: git's own lock)."""
    tmp = tmp or f".{name}.agent-sandbox-new"
    if not tmp.endswith(".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
    write_new(dfd, tmp, data, mode, sync=sync)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


class Repo:
    """One repository's config in the session: where its copies are, its original's mode."""

    __slots__ = ("git", "mode", "n", "swapped")

    def __init__(self, git: str, n: int, mode: int, swapped: bool = False) -> None:
        self.git = git  # the git dir, relative to the workdir
        self.n = n
        self.mode = mode
        self.swapped = swapped  # .git/config is our symlink (bwrap)

    @property
    def rel(self) -> str:
        return f"{self.git}/config"


class LiveConfigs:
    """The configs of one session's repositories (``swap``: bwrap's symlinks)."""

    def __init__(self, workdir: str, live: str, session: str) -> None:
        self.workdir = workdir
        self.live = live  # LIVE/<session> in the state dir
        self.session = session
        self.repos: list[Repo] = []
        self.lines: list[str] = []
        self.dropped: dict[str, set[str]] = {}  # rel -> keys refused so far
        self.restored: list[str] = []  # configs turned back from links into files
        self._lock = -1

    # -- the paths
    def host_dir(self, repo: Repo) -> str:
        return os.path.join(self.live, "host", str(repo.n))

    def inside_dir(self, repo: Repo) -> str:
        return os.path.join(self.live, "inside", str(repo.n))

    def binds(self) -> list[tuple[str, str]]:
        """bwrap's read-write binds: each session copy's directory onto the host copy's."""
        return [(self.inside_dir(r), self.host_dir(r)) for r in self.repos if r.swapped]

    def held_elsewhere(self) -> set[str]:
        """The configs bwrap must not hold read-only (the symlinks: the bind serves them)."""
        return {os.path.join(self.workdir, r.rel) for r in self.repos if r.swapped}

    def _record(self) -> None:
        data = json.dumps({"workdir": self.workdir, "session": self.session,
                           "repos": [[r.git, r.n, r.mode, r.swapped] for r in self.repos]})
        dfd = os.open(self.live, _DIR)
        try:
            replace(dfd, RECORD, data.encode(), 0o600, sync=True)
            os.fsync(dfd)
        finally:
            os.close(dfd)

    @classmethod
    def load(cls, live: str) -> LiveConfigs | None:
        try:
            with open(os.path.join(live, RECORD), "rb") as fh:
                data = json.loads(fh.read())
            out = cls(data["workdir"], live, data["session"])
            out.repos = [Repo(str(g), int(n), int(m), bool(s)) for g, n, m, s in data["repos"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return out

    def close(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


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
    root = os.open(snap.workdir, _DIR)
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
            saved = os.open(os.path.join(live, "saved"), _DIR)
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
    saved = os.open(os.path.join(live.live, "saved"), _DIR)
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
        dfd = os.open(path, _DIR)
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

def _merge(accepted: bytes, session: bytes) -> tuple[bytes, list[str]]:
    from libpolicy.gitconfig import merge_config

    merged, dropped = merge_config(accepted, session)
    return merged, list(dropped)


def _read_at(path: str, name: str) -> bytes | None:
    try:
        dfd = os.open(path, _DIR)
    except OSError:
        return None
    try:
        return read_small(dfd, name)
    finally:
        os.close(dfd)


def _take_lock(dfd: int, lock: str) -> int:
    """git's lock on a config (``config.lock``, O_EXCL), waited for up to LOCK_WAIT.

    A git writing holds it for a millisecond; one held longer is a stale or
    planted lock that would keep the config from being cleaned: it is taken
    over (removed), as git itself says to do with a stale lock.
    """
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            return os.open(lock, _NEW, 0o600, dir_fd=dfd)
        except FileExistsError:
            if time.monotonic() > deadline:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock, dir_fd=dfd)
            else:
                time.sleep(0.002)


def swap_locked(dfd: int, name: str, expect: bytes | None, data: bytes, mode: int) -> bool:
    """Under git's lock, make ``name`` hold ``data`` if it still holds ``expect``.

    False when it changed since it was read (the caller merges again): a
    write of the session's git between our read and our rename is never lost.
    """
    lock = name + ".lock"
    fd = _take_lock(dfd, lock)
    done = False
    try:
        if read_small(dfd, name) != expect:
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.close(fd)
        fd = -1
        os.rename(lock, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        done = True
        return True
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock, dir_fd=dfd)


def _accept_copy(live: LiveConfigs, repo: Repo, accepted: bytes, merged: bytes) -> None:
    """The host's copy (bwrap: what host git reads; Landlock: the last accepted) := merged."""
    if merged == accepted:
        return
    dfd = os.open(live.host_dir(repo), _DIR)
    try:
        swap_locked(dfd, "config", accepted, merged, repo.mode)
    finally:
        os.close(dfd)


def _mark(live: LiveConfigs, repo: Repo, what: str, data: bytes | None = None) -> bytes | None:
    """The session's bytes last merged (``base``) or the host copy's bytes last written by us
    (``written``): kept on disk for a repair after a crash; read (``data`` None) or set.
    Before the first merge both are the original."""
    name = f"{repo.n}.{what}"
    if data is not None:
        os.makedirs(os.path.join(live.live, "marks"), mode=0o700, exist_ok=True)
        dfd = os.open(os.path.join(live.live, "marks"), _DIR)
        try:
            replace(dfd, name, data, 0o600)
        finally:
            os.close(dfd)
        return data
    found = _read_at(os.path.join(live.live, "marks"), name)
    return found if found is not None else _read_at(os.path.join(live.live, "saved"), str(repo.n))


def sync(live: LiveConfigs, repo: Repo) -> None:
    """bwrap: the allowed keys the session changed in its copy, into the host's copy.

    Three versions: what the session's copy held at the last merge (its
    base), what it holds now, and the host's copy.  Only when the session
    changed something is anything merged; when the person's own git changed
    the host's copy meanwhile, theirs is kept whole and the session's
    version goes to the quarantine with a line (never a silent revert of
    either).
    """
    session = _read_at(live.inside_dir(repo), "config")
    if session is None:
        _refused(live, repo, [_NOT_A_CONFIG], None)
        return
    base = _mark(live, repo, "base")
    host = _read_at(live.host_dir(repo), "config")
    if session == base or host is None or base is None:
        return
    if host != _mark(live, repo, "written"):
        merged, dropped = _merge(base, session)
        if dropped:
            _refused(live, repo, dropped, session)
        if merged != base:
            path = _keep(live, repo, session)
            live.lines.append(f"agent-sandbox: {shown(repo.rel)} [git-config]: changed on the "
                              "host during the session, so the session's changes were not "
                              f"merged; its version is in {quote(path)}")
        _mark(live, repo, "base", session)
        return
    merged, dropped = _merge(host, session)
    if dropped:
        _refused(live, repo, dropped, session)
    if merged == host or _swap_at(live.host_dir(repo), host, merged, repo.mode):
        _mark(live, repo, "written", merged)
        _mark(live, repo, "base", session)


def _swap_at(path: str, expect: bytes, data: bytes, mode: int) -> bool:
    dfd = os.open(path, _DIR)
    try:
        return swap_locked(dfd, "config", expect, data, mode)
    finally:
        os.close(dfd)


def neutralize(live: LiveConfigs, repo: Repo) -> None:
    """Landlock: the workdir's config without the keys the session may not set, at once.

    Merged against the last accepted version (the host copy in the live
    dir) without a lock; only when something is refused is it rewritten,
    under git's ``config.lock`` and only if unchanged since it was read
    (else merged again), so no write of the session's git is ever lost.  A
    link, a directory or a huge file in its place is replaced by the
    accepted version.
    """
    root = os.open(live.workdir, _DIR)
    try:
        with _parent(root, repo.rel) as (gfd, name):
            for _ in range(20):  # each retry follows a write of the session's git
                if gfd < 0 or _neutralize_once(live, repo, gfd, name):
                    return
    finally:
        os.close(root)


def _neutralize_once(live: LiveConfigs, repo: Repo, gfd: int, name: str) -> bool:
    accepted = _read_at(live.host_dir(repo), "config")
    if accepted is None:
        return True
    session = read_small(gfd, name)
    if session is None:
        if _kind_at(gfd, name) == "missing":
            return True  # git removed it (or the repository): the sweep's
        merged, dropped = accepted, [_NOT_A_CONFIG]
    else:
        merged, dropped = _merge(accepted, session)
    if dropped:
        if not swap_locked(gfd, name, session, merged, repo.mode):
            return False
        _refused(live, repo, dropped, session)
    _accept_copy(live, repo, accepted, merged)
    return True


def _kind_at(dfd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _refused(live: LiveConfigs, repo: Repo, keys: list[str], session: bytes | None) -> None:
    """Remember the refused keys; keep the session's version that named new ones."""
    seen = live.dropped.setdefault(repo.rel, set())
    if set(keys) <= seen:
        return
    seen.update(keys)
    if session is not None:
        _keep(live, repo, session)


def clean_new(live: LiveConfigs, root: int, rel: str) -> None:
    """A config in a repository made in the session, without its command keys, at once.

    The payload a planted ``commondir`` or gitlink would point the host's
    git at: cleaned in the fast lane with the pure parser (the sweep's own
    judgement of the new repository follows in the backlog).  The session's
    version goes to the quarantine with one line.
    """
    for _ in range(20):
        with _parent(root, rel) as (gfd, name):
            if gfd < 0:
                return
            session = read_small(gfd, name)
            if session is None:
                return  # not a file, or huge: the sweep's (check_new_repo) in the backlog
            merged, dropped = _merge(b"", session)
            if not dropped:
                return
            mode = stat.S_IMODE(os.stat(name, dir_fd=gfd, follow_symlinks=False).st_mode)
            if swap_locked(gfd, name, session, merged, mode):
                git, _, last = rel.rpartition("/")
                path = _keep(live, Repo(git, -1, mode), session, last)
                named = ", ".join(map(shown, dropped))
                live.lines.append(f"agent-sandbox: {shown(rel)} [git-config]: a repository made "
                                  f"in the session names commands ({named}); removed at once, "
                                  f"its version is in {quote(path)}")
                return


def _keep(live: LiveConfigs, repo: Repo, data: bytes, base: str = "config") -> str:
    """The session's version in the quarantine, beside what the sweep moves there."""
    quarantine = os.path.join(os.path.dirname(os.path.dirname(live.live)), "quarantine",
                              live.session, repo.git)
    os.makedirs(quarantine, mode=0o700, exist_ok=True)
    n = 0
    while True:
        name = base if n == 0 else f"{base}.{n}"
        path = os.path.join(quarantine, name)
        try:
            with open(path, "xb") as fh:
                fh.write(data)
            return path
        except FileExistsError:
            n += 1


def _quarantine_lines(live: LiveConfigs) -> list[str]:
    out = []
    for repo in live.repos:
        keys = sorted(live.dropped.get(repo.rel, ()))
        if not keys:
            continue
        where = os.path.join(os.path.dirname(os.path.dirname(live.live)), "quarantine",
                             live.session, repo.git)
        named = ", ".join(shown(k) for k in keys)
        out.append(f"agent-sandbox: {shown(repo.rel)} [git-config]: the session set keys that "
                   f"can run commands ({named}); they never reached the host's config, the "
                   f"session's versions are in {shown(where)}")
    return out


# --- the end: a regular file back, on every exit path ---------------------------------

def finish(live: LiveConfigs, snap: Snapshot | None) -> list[str]:
    """Merge a last time, put regular files back, and tell the sweep they are accepted.

    Run once nothing of the session is alive, before the sweep.  A config
    the session replaced by something else (it cannot under bwrap: the
    watcher puts the link back) is left to the sweep, which restores the
    original.
    """
    root = os.open(live.workdir, _DIR)
    try:
        for repo in live.repos:
            try:
                final = _finish_one(live, root, repo)
            except OSError as exc:
                live.lines.append(f"agent-sandbox: {shown(repo.rel)} [git-config]: could not be "
                                  f"merged back: {exc.strerror or exc}; the original is in "
                                  f"{quote(os.path.join(live.live, 'saved', str(repo.n)))}")
                continue
            if final is not None and snap is not None:
                accept(snap, repo.rel, final, repo.mode)
    finally:
        os.close(root)
    lines = live.lines + _quarantine_lines(live)
    live.lines = []
    if not any("could not be merged back" in line for line in lines):
        import shutil

        shutil.rmtree(live.live, ignore_errors=True)
    live.close()
    return lines


def _finish_one(live: LiveConfigs, root: int, repo: Repo) -> bytes | None:
    """The config's final bytes, written in place; None when the sweep must judge it."""
    ours = os.path.join(live.host_dir(repo), "config")
    with _parent(root, repo.rel) as (gfd, name):
        if gfd < 0:
            return None
        try:
            linked = os.readlink(name, dir_fd=gfd) == ours
        except OSError:
            linked = False
        if not linked:
            if repo.swapped:
                return None  # something else took the link's place: the sweep's
            neutralize(live, repo)  # Landlock (or a start killed before its swap)
            return read_small(gfd, name)
        sync(live, repo)
        final = _read_at(live.host_dir(repo), "config")
        if final is None:
            final = _read_at(os.path.join(live.live, "saved"), str(repo.n))
        if final is None:
            return None
        replace(gfd, name, final, repo.mode)
        repo.swapped = False
        live.restored.append(repo.rel)
        return final


def accept(snap: Snapshot, rel: str, data: bytes, mode: int) -> None:
    """Record ``data`` as the entry's state: the sweep keeps it (the merged config)."""
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    rule = snap.entries.get(rel, ("git-config", None))[0]
    snap.blobs[digest] = data
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
