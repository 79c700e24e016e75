"""The host-run guard's sweep of what appeared: new repositories and new ``.git`` links.

A repository made during the session (``git init``, ``git clone``, a planted
bare repository) keeps only git's ``*.sample`` hooks and loses the config
keys that run commands (:mod:`libpolicy.gitconfig` decides, git itself parses
the bytes); a new ``.git`` file or link is moved aside unless it names a git dir
the sweep itself checks (a submodule's or a worktree's).
"""

from __future__ import annotations

import os
import shlex
import time
from typing import TYPE_CHECKING

from libbroker.launcher.hostrun_fingerprint import (
    O_DIR,
    Node,
    Snapshot,
    digest_of,
    parent_of,
    read_file,
)
from libpolicy.gitconfig import sanitized_pairs
from libpolicy.hostrun import NESTED_GIT

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_sweep import Sweeper



def check_new_gitlink(sweeper: Sweeper, root: int, rel: str, snap: Snapshot) -> None:
    """A ``.git`` that appeared: a repository is checked as new; a file or link is moved aside
    unless it names a git dir the sweep itself checks (a submodule's or worktree's)."""
    with parent_of(root, rel) as (pfd, name):
        if pfd < 0:
            return
        now = sweeper.looker.node(pfd, name)
        if now is None or now.kind == "dir":
            return  # a new repository: _new_repo
        if now.kind == "file":
            try:
                _, data = read_file(pfd, name, 4096)
            except OSError:
                data = b""
            if _gitlink_ok(snap, root, rel, data):
                return
        sweeper.check(root, rel, "git-dir", None)


def _gitlink_ok(snap: Snapshot, root: int, rel: str, data: bytes) -> bool:
    text = data.decode(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return False
    target = text[len("gitdir:"):].strip()
    if target.startswith("/"):
        if not target.startswith(snap.workdir + "/"):
            return False
        target = target[len(snap.workdir) + 1:]
    else:
        target = os.path.join(os.path.dirname(rel), target)
    target = os.path.normpath(target)
    parts = target.split("/")
    if target.startswith("..") or ".git" not in parts:
        return False
    at = parts.index(".git")
    if len(parts) < at + 3 or parts[at + 1] not in NESTED_GIT:
        return False
    # Every directory on the way must be a directory, not a link (fds, one name each).
    with parent_of(root, target + "/HEAD") as (fd, _):
        return fd >= 0


def check_new_repo(sweeper: Sweeper, root: int, rel: str) -> None:
    """A repository that was not there at the start: sample hooks only, no command-running keys."""
    with parent_of(root, rel + "/x") as (gfd, _):
        if gfd < 0:
            return
        worktree = "/worktrees/" in f"/{rel}"
        # hooks/: only git's *.sample files stay (git never runs them).
        hooks = sweeper.looker.node(gfd, "hooks")
        if hooks is not None and hooks.kind != "dir":
            q = sweeper.move_aside(gfd, "hooks", f"{rel}/hooks")
            path = os.path.join(sweeper.snap.workdir, rel, "hooks")
            sweeper.say(f"{rel}/hooks", "git-hooks", f"a {hooks.kind} in a repository made in "
                        f"the session; moved to {shlex.quote(q)}",
                        f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")
        elif hooks is not None and hooks.children is not None:
            hfd = os.open("hooks", O_DIR, dir_fd=gfd)
            try:
                for name, node in hooks.children.items():
                    if node.kind == "file" and name.endswith(".sample"):
                        continue
                    q = sweeper.move_aside(hfd, name, f"{rel}/hooks/{name}")
                    path = os.path.join(sweeper.snap.workdir, rel, "hooks", name)
                    sweeper.say(f"{rel}/hooks/{name}", "git-hooks",
                                f"a hook in a repository made in the session; moved to "
                                f"{shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} "
                                f"{shlex.quote(path)}")
            finally:
                os.close(hfd)
        for name, rule in (("config", "git-config"), ("config.worktree", "git-config-worktree")):
            _sanitize_config(sweeper, gfd, rel, name, rule)
        common = sweeper.looker.node(gfd, "commondir")
        if common is not None:
            ok = False
            if worktree and common.kind == "file":
                try:
                    ok = read_file(gfd, "commondir", 64)[1].strip() == b"../.."
                except OSError:
                    ok = False
            if not ok:
                q = sweeper.move_aside(gfd, "commondir", f"{rel}/commondir")
                path = os.path.join(sweeper.snap.workdir, rel, "commondir")
                sweeper.say(f"{rel}/commondir", "git-commondir",
                            f"redirects a repository made in the session; moved to "
                            f"{shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")


def _sanitize_config(sweeper: Sweeper, gfd: int, rel: str, name: str, rule: str) -> None:
    node = sweeper.looker.node(gfd, name)
    if node is None:
        return
    entry_rel = f"{rel}/{name}"
    path = os.path.join(sweeper.snap.workdir, entry_rel)
    if node.kind != "file":
        q = sweeper.move_aside(gfd, name, entry_rel)
        sweeper.say(entry_rel, rule, f"not a file in a repository made in the session; moved "
                    f"to {shlex.quote(q)}", f"mv -T -- {shlex.quote(q)} {shlex.quote(path)}")
        return
    _, data = read_file(gfd, name)
    result = sanitized_config(data)
    if result is None:
        return
    clean, keys = result
    q = sweeper.move_aside(gfd, name, entry_rel)
    digest = digest_of(clean)
    sweeper.snap.blobs[digest] = clean
    sweeper.materialize(gfd, name, Node("file", 0o644, len(clean), time.time_ns(), 0, digest))
    sweeper.say(entry_rel, rule, f"a repository made in the session names commands in its "
                f"config ({', '.join(keys)}); those keys are dropped, the whole file moved to "
                f"{shlex.quote(q)}", f"mv -f -T -- {shlex.quote(q)} {shlex.quote(path)}")


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
