"""The host-run guard's sweep of git directories: new repositories, gitlinks, commondir.

A repository made during the session (``git init``, ``git clone``, a planted
bare repository, one nested deep in ``.git/modules/``) keeps only git's
``*.sample`` hooks, no rebase or sequencer state, and loses the config keys
that may run commands (:mod:`libpolicy.gitconfig` decides, by an allow-list).

Where a ``.git`` file or a ``commondir`` points is judged as the kernel
resolves it, links followed the way git follows them, and nothing written
through them: the target is opened ``O_PATH`` (which reads nothing and
writes nothing); its real path (``/proc/self/fd``) goes to
:func:`libpolicy.hostrun.gitlink_verdict`.  It must be a guarded git dir
(the start's repository there, or one inside a git dir: a submodule's or a
worktree's, checked as new when it is), or the one outside the workdir that
an existing pointer named at the start (by device and inode); anything
else, or a pointer that cannot be read, is moved aside.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from libbroker.launcher.hostrun_fingerprint import Node, Snapshot, digest_of, read_small
from libbroker.launcher.hostrun_fs import open_dir, open_file, parent_of
from libbroker.launcher.hostrun_walk import GIT_STATE, Walk
from libpolicy import gitconfig
from libpolicy.hostrun import gitlink_verdict

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_sweep import Sweeper

MAX_CONFIG = 1 << 20  # a bigger config in a new repository is moved aside whole
MAX_HOOKS = 16  # more entries than this in a new repository's hooks/: moved aside whole


def target(dfd: int, data: bytes, prefix: bytes) -> tuple[int, int] | None:
    """(dev, ino) of the directory a ``gitdir:``/``commondir`` file names, as git finds it.

    ``data`` is the file's bytes, relative paths start at ``dfd``; None when
    it names nothing git could use (no prefix, no such directory).
    """
    found = target_path(dfd, data, prefix)
    return None if found is None else found[:2]


def target_path(dfd: int, data: bytes, prefix: bytes) -> tuple[int, int, str] | None:
    """:func:`target`, and the directory's real path (the kernel's, from /proc/self/fd)."""
    text = data.rstrip(b"\r\n\t ")
    if not text.startswith(prefix):
        return None
    path = text[len(prefix):].lstrip(b" ") if prefix else text
    if not path or b"\0" in path:
        return None
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino, os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def outside_targets(root: int, walk: Walk) -> list[tuple[int, int]]:
    """At the start: where the existing gitlinks and commondirs point, outside the workdir's
    git dirs (a worktree of a repository elsewhere): allowed at the end too."""
    inside = git_dir_ids(root, walk)
    found = set()
    for rel, name, prefix in _pointers(walk):
        with parent_of(root, f"{rel}/{name}" if rel else name) as (dfd, _):
            data = _read_pointer(dfd, name) if dfd >= 0 else None
            at = None if data is None else target(dfd, data, prefix)
            if at is not None and at not in inside:
                found.add(at)
    return sorted(found)


def _pointers(walk: Walk) -> list[tuple[str, str, bytes]]:
    out = []
    for rel in walk.gitlinks:
        parent, _, name = rel.rpartition("/")
        out.append((parent, name, b"gitdir:"))
    out += [(rel, "commondir", b"") for rel, _ in walk.git_dirs]
    return out


def git_dir_ids(root: int, walk: Walk) -> set[tuple[int, int]]:
    dev = os.fstat(root).st_dev
    return {(dev, ino) for _, ino in walk.git_dirs}


def guarded(rel: str, ino: int, snap: Snapshot) -> bool:
    """Whether a git dir may be a gitlink's or commondir's target: the start's own repository
    there, or one inside a git dir (a submodule's or worktree's, which git itself makes)."""
    return snap.repos.get(rel) == ino or ".git" in rel.split("/")[:-1]


def verdict(root: int, snap: Snapshot, dfd: int, data: bytes, prefix: bytes,
            git_dirs: set[str]) -> str | None:
    """Why the pointer with bytes ``data`` in ``dfd`` may not stay (None: it may), judged by
    :func:`libpolicy.hostrun.gitlink_verdict` on its target as the kernel resolves it."""
    found = target_path(dfd, data, prefix)
    if found is None:
        return None  # names nothing git could use
    dev, ino, real = found
    if (dev, ino) in snap.targets:
        return None  # the start's own, outside the workdir
    top = os.readlink(f"/proc/self/fd/{root}")
    rel = "" if real == top else real[len(top) + 1:] if real.startswith(top + "/") else None
    return gitlink_verdict(rel, git_dirs)


def judge_pointers(sweeper: Sweeper, root: int, walk: Walk) -> None:
    """Every gitlink and commondir must point at a guarded git dir (or the start's outside
    one); what cannot be read, or points elsewhere, is moved aside."""
    snap = sweeper.snap
    git_dirs = {rel for rel, ino in walk.git_dirs if guarded(rel, ino, snap)}
    for rel, name, prefix in _pointers(walk):
        entry = f"{rel}/{name}" if rel else name
        try:  # most git dirs have no commondir: one lstat, not an open per level
            os.stat(entry, dir_fd=root, follow_symlinks=False)
        except FileNotFoundError:
            continue  # not there by any way (a link on the way: the fd walk skips it too)
        except OSError:
            pass
        with parent_of(root, entry, fix=True) as (dfd, _):
            if dfd < 0 or not sweeper.exists(dfd, name):
                continue
            data = _read_pointer(dfd, name)
            why = "it cannot be read" if data is None else verdict(root, snap, dfd, data,
                                                                   prefix, git_dirs)
            if why is not None:
                rule = "git-dir" if prefix else "git-commondir"
                sweeper.aside(dfd, name, entry, rule, f"git would take hooks and config from "
                              f"where it points, and {why}")


def _read_pointer(dfd: int, name: str) -> bytes | None:
    """A gitlink's or commondir's bytes; None when it is not a small readable file."""
    try:
        if not _is_file(dfd, name):
            return None
        fd = open_file(dfd, name, fix=True)
        try:
            data = read_small(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    return data if len(data) <= 4096 else None


def check_new_gitlink(sweeper: Sweeper, root: int, rel: str, snap: Snapshot) -> None:
    """A ``.git`` that appeared, judged alone (the live guard's question).

    A directory is a new repository; a ``gitdir:`` file may stay when it
    names a guarded git dir (:func:`guarded`: then checked as a new one if it
    is new) or the start's outside one; anything else is moved aside.
    """
    with parent_of(root, rel, fix=True) as (pfd, name):
        if pfd < 0 or not sweeper.exists(pfd, name):
            return
        if stat.S_ISDIR(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode):
            check_new_repo(sweeper, root, rel)
            return
        data = _read_pointer(pfd, name)
        found = None if data is None else target_path(pfd, data, b"gitdir:")
        if data is not None and found is None:
            return  # names nothing git could use
        top = os.readlink(f"/proc/self/fd/{root}")
        inside = found[2][len(top) + 1:] if found and found[2].startswith(top + "/") else ""
        nested = bool(inside) and guarded(inside, found[1] if found else 0, snap)
        why = "it cannot be read" if data is None else verdict(
            root, snap, pfd, data, b"gitdir:", set(snap.repos) | ({inside} if nested else set()))
        if why is None:
            if nested and snap.repos.get(inside) != (found[1] if found else 0):
                check_new_repo(sweeper, root, inside)
            return
        sweeper.aside(pfd, name, rel, "git-dir", f"git would take hooks and config from where "
                      f"it points, and {why}")


def check_new_repo(sweeper: Sweeper, root: int, rel: str) -> None:
    """A git dir that was not there at the start: sample hooks only, no command-running keys."""
    with parent_of(root, rel, fix=True) as (pfd, name):
        if pfd < 0 or not sweeper.exists(pfd, name):
            return
        try:
            gfd = open_dir(pfd, name, fix=True)
        except OSError:
            sweeper.aside(pfd, name, rel, "git-dir", "a repository made in the session that "
                          "cannot be read")
            return
        try:
            _hooks(sweeper, gfd, rel)
            for cname, rule in (("config", "git-config"),
                                ("config.worktree", "git-config-worktree")):
                _sanitize_config(sweeper, gfd, rel, cname, rule)
            for entry in GIT_STATE:
                state = entry.parts[0]
                if sweeper.exists(gfd, state):
                    sweeper.aside(gfd, state, f"{rel}/{state}", entry.rule,
                                  "in a repository made in the session")
        finally:
            os.close(gfd)


def _hooks(sweeper: Sweeper, gfd: int, rel: str) -> None:
    where = f"{rel}/hooks"
    if not sweeper.exists(gfd, "hooks"):
        return
    try:
        hfd = open_dir(gfd, "hooks", fix=True)
        names = sorted(os.listdir(hfd))
    except OSError:
        sweeper.aside(gfd, "hooks", where, "git-hooks", "not a readable directory, in a "
                      "repository made in the session")
        return
    try:
        bad = [n for n in names if not (n.endswith(".sample") and _is_file(hfd, n))]
        if len(bad) > MAX_HOOKS:
            os.close(hfd)
            hfd = -1
            sweeper.aside(gfd, "hooks", where, "git-hooks", f"{len(bad)} hooks in a "
                          "repository made in the session")
            return
        for hook in bad:
            sweeper.aside(hfd, hook, f"{where}/{hook}", "git-hooks",
                          "a hook in a repository made in the session")
    finally:
        if hfd >= 0:
            os.close(hfd)


def _is_file(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _sanitize_config(sweeper: Sweeper, gfd: int, rel: str, name: str, rule: str) -> None:
    if not sweeper.exists(gfd, name):
        return
    entry = f"{rel}/{name}"
    try:
        if not _is_file(gfd, name):
            raise OSError("not a file")
        fd = open_file(gfd, name, fix=True)
        try:
            data = read_small(fd, MAX_CONFIG)
        finally:
            os.close(fd)
        if len(data) > MAX_CONFIG:
            raise OSError("too big to check")
    except OSError as exc:
        sweeper.aside(gfd, name, entry, rule, f"{exc.strerror or exc}, in a repository made "
                      "in the session")
        return
    result = sanitized_config(data)
    if result is None:
        return
    clean, keys = result
    digest = digest_of(clean)
    sweeper.snap.blobs[digest] = clean
    sweeper.aside(gfd, name, entry, rule, "a repository made in the session names commands "
                  f"in its config ({', '.join(keys)}); those keys are dropped",
                  replace=Node("file", 0o644, len(clean), digest=digest))


def sanitized_config(data: bytes) -> tuple[bytes, list[str]] | None:
    """The config with only the keys that cannot run anything, and the others; None when it
    has no other (:func:`libpolicy.gitconfig.sanitized_config`)."""
    return gitconfig.sanitized_config(data)
