"""The host-run guard's sweep of git directories: new repositories, gitlinks, commondir.

A repository made during the session (``git init``, ``git clone``, a planted
bare repository, one nested deep in ``.git/modules/``) keeps only git's
``*.sample`` hooks, no rebase or sequencer state, and loses the config keys
that run commands (:mod:`libpolicy.gitconfig` decides, git itself parses the
bytes).

Where a ``.git`` file or a ``commondir`` points is judged as the kernel
resolves it, links followed the way git follows them, and nothing written
through them: the target is opened ``O_PATH`` (which reads nothing and
writes nothing) and known by its device and inode.  It must be a git
directory this sweep found and checked, or one outside the workdir that an
existing gitlink already named at the start; anything else is moved aside.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from libbroker.launcher.hostrun_fingerprint import Node, digest_of, read_small
from libbroker.launcher.hostrun_fs import open_dir, open_file, parent_of
from libbroker.launcher.hostrun_walk import GIT_STATE, Walk
from libpolicy.gitconfig import sanitized_pairs

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_sweep import Sweeper

MAX_CONFIG = 1 << 20  # a bigger config in a new repository is moved aside whole
MAX_HOOKS = 16  # more entries than this in a new repository's hooks/: moved aside whole


def target(dfd: int, data: bytes, prefix: bytes) -> tuple[int, int] | None:
    """(dev, ino) of the directory a ``gitdir:``/``commondir`` file names, as git finds it.

    ``data`` is the file's bytes, relative paths start at ``dfd``; None when
    it names nothing git could use (no prefix, no such directory).
    """
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
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _read_target(dfd: int, name: str, prefix: bytes) -> tuple[int, int] | bool | None:
    """The target of the file ``name``: (dev, ino), None (names nothing), False (unreadable)."""
    try:
        fd = open_file(dfd, name, fix=True)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        data = read_small(fd, 4096)
    finally:
        os.close(fd)
    return target(dfd, data, prefix) if len(data) <= 4096 else False


def outside_targets(root: int, walk: Walk) -> list[tuple[int, int]]:
    """At the start: where the existing gitlinks and commondirs point, outside the workdir's
    git dirs (a worktree of a repository elsewhere): allowed at the end too."""
    inside = git_dir_ids(root, walk)
    found = set()
    for rel, name, prefix in _pointers(walk):
        with parent_of(root, f"{rel}/{name}" if rel else name) as (dfd, _):
            if dfd >= 0:
                at = _read_target(dfd, name, prefix)
                if isinstance(at, tuple) and at not in inside:
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


def judge_pointers(sweeper: Sweeper, root: int, walk: Walk) -> None:
    """Every gitlink and commondir must point at a checked git dir (or the start's outside one)."""
    allowed = git_dir_ids(root, walk) | set(sweeper.snap.targets)
    for rel, name, prefix in _pointers(walk):
        entry = f"{rel}/{name}" if rel else name
        with parent_of(root, entry, fix=True) as (dfd, _):
            if dfd < 0:
                continue
            at = _read_target(dfd, name, prefix)
            if at is None or (isinstance(at, tuple) and at in allowed):
                continue
            why = "cannot be read" if at is False else "points at a directory no sweep checked"
            rule = "git-dir" if prefix else "git-commondir"
            sweeper.aside(dfd, name, entry, rule, f"{why} (git would take hooks and config "
                          "from there)")


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
    import stat

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


def config_entries(data: bytes) -> list[tuple[str, str]] | None:
    """``(key, value)`` of a git config file's bytes, parsed by git itself; None if unparseable.

    The bytes come on stdin (never a path the agent could swap), and
    ``--no-includes`` keeps git from reading anything else.
    """
    import subprocess

    try:
        done = subprocess.run(["git", "config", "--file", "-", "--list", "--null",
                               "--no-includes"], input=data, capture_output=True, timeout=10,
                              check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    out = []
    for item in done.stdout.split(b"\0"):
        if item:
            key, _, value = item.decode(errors="replace").partition("\n")
            out.append((key, value))
    return out


def sanitized_config(data: bytes) -> tuple[bytes, list[str]] | None:
    """The config without its command-running keys, and those keys; None when it has none."""
    return sanitized_pairs(config_entries(data))
