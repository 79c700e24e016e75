"""Nothing the agent writes in the workdir runs later on the host: fingerprint, then sweep.

The host-run files (:mod:`libpolicy.hostrun`: git hooks and config in every
repository, the agents' project files, editor and shell files) are looked at
twice, on the host, with the user's rights: :mod:`.hostrun_scan` at session
start (in a thread, while the servers start) and :mod:`.hostrun_sweep` at
session end (every exit path, the janitor's included).  This module is the
launcher's face of both: :class:`Guard` runs them for a session,
:func:`janitor_sweep` for the janitor, and :func:`bwrap_args` holds the
existing entries read-only in a bwrap sandbox.

The parts: :mod:`.hostrun_fs` (fd-relative, link-free, bounded primitives),
:mod:`.hostrun_fingerprint` (nodes, the snapshot, saved originals),
:mod:`.hostrun_walk` (finding git directories and entries),
:mod:`.hostrun_scan`, :mod:`.hostrun_sweep`, :mod:`.hostrun_newrepo` (git
directories made during the session, gitlinks, commondirs),
and :mod:`.hostrun_renamed` (a moved ``.git`` put back).  Every printed
word goes through :mod:`libbroker.shellquote`.
"""

from __future__ import annotations

import contextlib
import os
import stat

from libbroker.launcher.hostrun_fingerprint import Snapshot
from libbroker.launcher.hostrun_newrepo import sanitized_config
from libbroker.launcher.hostrun_scan import load, scan
from libbroker.launcher.hostrun_sweep import state_dir, sweep
from libbroker.shellquote import quote
from libpolicy.gitconfig import runs_commands as runs_commands  # the tests ask the guard
from libpolicy.hostrun import Table

__all__ = ["Guard", "Snapshot", "bwrap_args", "bwrap_pin", "bwrap_protect",
           "janitor_sweep", "load", "runs_commands", "sanitized_config", "scan", "state_dir",
           "sweep"]


class Guard:
    """One session's guard: the scan in a thread from the start, the sweep at the end.

    The scan overlaps the servers' start (its directory reads release the
    GIL, and the launcher mostly waits on their ``listening`` lines);
    :meth:`wait` joins it before the command may run.  :meth:`finish` sweeps
    (once every process of the session is gone) and prints its lines.
    """

    def __init__(self, workdir: str, table: Table, runtime_dir: str, state: str) -> None:
        from libbroker.quick_thread import QuickThread  # its start waits for no core

        self.state = state
        self.snap: Snapshot | None = None
        self.error: BaseException | None = None
        self._args = (workdir, table, runtime_dir)
        self._thread = QuickThread(self._scan, name="hostrun-scan")
        self._thread.start()
        # What finished sessions set aside (hostrun_gitconfig), removed meanwhile.
        self._tidy = QuickThread(self._remove_set_aside, name="hostrun-tidy")
        self._tidy.start()

    def _remove_set_aside(self) -> None:
        from libbroker.launcher.hostrun_gitconfig import remove_set_aside

        with contextlib.suppress(OSError):
            remove_set_aside(self.state)

    def _scan(self) -> None:
        workdir, table, runtime_dir = self._args
        try:
            self.snap = scan(workdir, table, runtime_dir=runtime_dir, state=self.state)
        except BaseException as exc:  # reported by wait(), in the launcher's thread
            self.error = exc

    def wait(self) -> Snapshot:
        """The snapshot, once the scan is done; LaunchError if it failed (no session then)."""
        self._thread.join()
        if self.snap is None:
            from libbroker.errors import LaunchError

            why = self.error.strerror if isinstance(self.error, OSError) else self.error
            raise LaunchError(f"cannot look at the workdir's host-run files: {why}")
        return self.snap

    def finish(self, out: int = 2, quiet: frozenset[str] | None = None) -> list[str]:
        """Sweep (nothing of the session may be alive) and write its lines to ``out``;
        ``quiet``: the live guard's directories that no event named."""
        self._thread.join()
        self._tidy.join()
        if self.snap is None:
            return []
        snap, self.snap = self.snap, None
        try:
            lines = sweep(snap, self.state, quiet=quiet)
        except Exception as exc:  # the teardown goes on; the person is told
            why = exc.strerror if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            lines = [f"agent-sandbox: the sweep of {quote(snap.workdir)} failed: {why}; "
                     "check its git hooks and config before using git there"]
        if lines:
            text = "".join(line + "\n" for line in lines)
            with contextlib.suppress(OSError):
                os.write(out, text.encode(errors="replace"))
        return lines


def shared_workdir(workdir: str) -> str | None:
    """One line when ``workdir`` is a directory every user may write to (world-writable
    and sticky: /tmp, /var/tmp, /dev/shm): what other programs create there during the
    session cannot be told from the agent's, so host-run files among it are swept too
    (moved to the quarantine, never deleted).  None for a directory of one's own."""
    try:
        mode = os.stat(workdir).st_mode
    except OSError:
        return None
    if not (mode & stat.S_IWOTH and mode & stat.S_ISVTX):
        return None
    return (f"agent-sandbox: the workdir {quote(workdir)} is shared with every user "
            "(world-writable, sticky): host-run files (git hooks and config, .envrc, ...) "
            "that any program makes there during the session are swept as the agent's; "
            "run from a project directory of your own, or name one with --workdir")


def janitor_sweep(runtime_dir: str) -> None:
    """The janitor's sweep, after a launcher killed before its own (lines go to sweep.log)."""
    snap = load(runtime_dir)
    if snap is not None:
        sweep(snap, state_dir())


def bwrap_protect(snap: Snapshot) -> list[str]:
    """Existing entries to hold read-only in a bwrap sandbox (``--ro-bind P P`` each).

    Every repository's hooks, config, commondir and config.worktree (its
    modules' and worktrees' too) and every other existing entry.  Bind them
    after :func:`bwrap_pin`'s: a bind onto a mount point's inside stays.
    """
    out = []
    for rel, (_, node) in sorted(snap.entries.items()):
        # A repository's own directory is pinned, not held: git inside the
        # sandbox writes its objects, index and refs there.
        if node is not None and node.kind in ("file", "dir") and rel not in snap.repos:
            out.append(os.path.join(snap.workdir, rel))
    return out


def bwrap_pin(snap: Snapshot) -> list[str]:
    """The git directories to bind onto themselves (``--bind P P``): a mount point cannot be
    renamed or removed (EBUSY), so ``mv .git .git-away`` fails inside the sandbox."""
    return [os.path.join(snap.workdir, rel) for rel, ino in sorted(snap.repos.items()) if ino]


def bwrap_args(snap: Snapshot) -> list[str]:
    """bwrap's arguments for both, in order, to follow the workdir's ``--bind``."""
    argv: list[str] = []
    for path in bwrap_pin(snap):
        argv += ["--bind", path, path]
    for path in bwrap_protect(snap):
        argv += ["--ro-bind", path, path]
    return argv
