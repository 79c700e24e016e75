"""The host-run guard for the git directories a session grants outside its workdir.

A session started in a linked worktree or a submodule is granted, besides
the workdir, the git directories git writes there: the main repository's
``.git`` (a worktree's common dir) or the superproject's ``.git/modules/NAME``
(:func:`libbroker.launcher.git_answers.outside_git_dirs`).  Their hooks and
config run on the host like the workdir's own, so each gets a
:class:`~libbroker.launcher.hostrun_guard.Guard` of its own, rooted at that
directory: fingerprinted at start, held read-only under bwrap, swept at the
end, its snapshot in the runtime dir (``hostrun-gitdir-N/``) so that the
janitor sweeps it too after a ``kill -9`` of the launcher.  And the
workdir's own: :func:`prepare_workdir` gives a repository lacking one an
empty ``.git/hooks`` to hold.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from libbroker.launcher import hostrun_guard

if TYPE_CHECKING:
    from libbroker.launcher.config import Config

PREFIX = "hostrun-gitdir-"  # in the runtime dir: one per git dir


def start(cfg: Config, runtime_dir: str, state: str) -> list[hostrun_guard.Guard]:
    """A guard scanning each of ``cfg.git_dirs`` (in its thread, as the workdir's)."""
    from libpolicy.hostrun import Table

    guards = []
    for index, path in enumerate(cfg.git_dirs):
        # The user's additions and opt-outs by rule; an opt-out of a path is the workdir's.
        table = Table(cfg.hostrun_add, tuple(a for a in cfg.hostrun_allow if "/" not in a), path)
        with_git_hooks(path, cfg.protect_git)
        snapshot_dir = os.path.join(runtime_dir, f"{PREFIX}{index}")
        os.mkdir(snapshot_dir, 0o700)
        guards.append(hostrun_guard.Guard(path, table, snapshot_dir, state))
    return guards


def with_git_hooks(git_dir: str, protect: bool) -> None:
    """An empty ``hooks/`` where a git dir lacks one, so that it exists to be held read-only."""
    if protect and not os.path.islink(git_dir):
        try:
            os.mkdir(os.path.join(git_dir, "hooks"), 0o755)
        except OSError:
            return  # there already, or a read-only repository: the bind does its job or skips


def bwrap_holds(guards: list[hostrun_guard.Guard]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What to pin and hold for bwrap in these git dirs, once each scan is done."""
    pin: list[str] = []
    hold: list[str] = []
    for guard in guards:
        snap = guard.wait()
        pin += hostrun_guard.bwrap_pin(snap)
        hold += hostrun_guard.bwrap_protect(snap)
    return tuple(pin), tuple(hold)


def janitor_sweep(runtime_dir: str) -> None:
    """The janitor's sweep of each git dir's snapshot (after a launcher killed before its own)."""
    try:
        names = sorted(os.listdir(runtime_dir))
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX):
            hostrun_guard.janitor_sweep(os.path.join(runtime_dir, name))


def prepare_workdir(cfg: Config) -> None:
    """Create an empty ``.git/hooks`` in a repository that lacks one.

    A missing directory cannot be bound read-only, and a command could
    create it (and a hook in it); an empty one is harmless to git.
    """
    git = os.path.join(cfg.workdir, ".git")
    if cfg.protect_git and os.path.isdir(git) and not os.path.islink(git):
        # Already there, or a read-only repository: the bind then does its job or skips.
        with contextlib.suppress(OSError):
            os.mkdir(os.path.join(git, "hooks"), 0o755)
