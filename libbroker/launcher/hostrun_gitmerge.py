"""The live guard's merges of a repository's config, by key, as the session writes it.

bwrap and Landlock with a mount namespace: the session writes a private copy
and :func:`sync` merges it into the host's copy three-way.  Landlock without
one: the session writes the workdir's file and :func:`neutralize` rewrites it
at once without the refused keys.  A new repository's config is cleaned by
:func:`clean_new`.  :func:`libpolicy.gitconfig.merge_config` decides which key
may change; :mod:`.hostrun_gitconfig` says how the copies are laid out.
"""

from __future__ import annotations

import json
import os
import stat

from libbroker.launcher.hostrun_files import (
    NOT_A_CONFIG,
    O_DIR,
    kind_at,
    read_at,
    read_small,
    replace,
    swap_locked,
)
from libbroker.launcher.hostrun_fingerprint import parent_of as _parent
from libbroker.shellquote import quote, shown

RECORD = "record.json"

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
        dfd = os.open(self.live, O_DIR)
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


def _merge(accepted: bytes, session: bytes) -> tuple[bytes, list[str]]:
    from libpolicy.gitconfig import merge_config

    merged, dropped = merge_config(accepted, session)
    return merged, list(dropped)


def _accept_copy(live: LiveConfigs, repo: Repo, accepted: bytes, merged: bytes) -> None:
    """The host's copy (bwrap: what host git reads; Landlock: the last accepted) := merged."""
    if merged == accepted:
        return
    dfd = os.open(live.host_dir(repo), O_DIR)
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
        dfd = os.open(os.path.join(live.live, "marks"), O_DIR)
        try:
            replace(dfd, name, data, 0o600)
        finally:
            os.close(dfd)
        return data
    found = read_at(os.path.join(live.live, "marks"), name)
    return found if found is not None else read_at(os.path.join(live.live, "saved"), str(repo.n))


def sync(live: LiveConfigs, repo: Repo) -> None:
    """bwrap: the allowed keys the session changed in its copy, into the host's copy.

    Three versions: what the session's copy held at the last merge (its
    base), what it holds now, and the host's copy.  Only when the session
    changed something is anything merged; when the person's own git changed
    the host's copy meanwhile, theirs is kept whole and the session's
    version goes to the quarantine with a line (never a silent revert of
    either).
    """
    session = read_at(live.inside_dir(repo), "config")
    if session is None:
        _refused(live, repo, [NOT_A_CONFIG], None)
        return
    base = _mark(live, repo, "base")
    host = read_at(live.host_dir(repo), "config")
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
    dfd = os.open(path, O_DIR)
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
    root = os.open(live.workdir, O_DIR)
    try:
        with _parent(root, repo.rel) as (gfd, name):
            for _ in range(20):  # each retry follows a write of the session's git
                if gfd < 0 or _neutralize_once(live, repo, gfd, name):
                    return
    finally:
        os.close(root)


def _neutralize_once(live: LiveConfigs, repo: Repo, gfd: int, name: str) -> bool:
    accepted = read_at(live.host_dir(repo), "config")
    if accepted is None:
        return True
    session = read_small(gfd, name)
    if session is None:
        if kind_at(gfd, name) == "missing":
            return True  # git removed it (or the repository): the sweep's
        merged, dropped = accepted, [NOT_A_CONFIG]
    else:
        merged, dropped = _merge(accepted, session)
    if dropped:
        if not swap_locked(gfd, name, session, merged, repo.mode):
            return False
        _refused(live, repo, dropped, session)
    _accept_copy(live, repo, accepted, merged)
    return True


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


def quarantine_lines(live: LiveConfigs) -> list[str]:
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
