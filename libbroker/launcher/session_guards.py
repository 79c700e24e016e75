"""A session's host-run guards, held as one: begun step by step, ended together in one order.

- the workdir's scan (:mod:`.hostrun_guard`), begun with the session in a
  thread, waited for before go; the same for the git dirs outside the workdir
  (a linked worktree's common dir, a submodule's git dir: :mod:`.gitdir_guard`);
- the live guard of the workdir's git configs while CMD runs
  (:mod:`.hostrun_live`), begun by the backend's box where it can hold them;
- its fanotify gate, where allowed (:mod:`.hostrun_gate`).

:meth:`Guards.end` is the session's last step but the runtime directory's:
nothing of the session is alive to race the sweep then.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, cast

from libbroker.errors import LaunchError
from libbroker.launcher import config, gitdir_guard, hostrun_guard
from libbroker.launcher.trace import trace

if TYPE_CHECKING:
    from libbroker.launcher.config import Config
    from libbroker.launcher.hostrun_gate import Gate
    from libbroker.launcher.hostrun_gate_client import ServiceGate
    from libbroker.launcher.hostrun_live import Watcher


def say(lines: list[str]) -> None:
    """Lines for the person on stderr (a closed stderr does not stop the session)."""
    if lines:
        with contextlib.suppress(OSError):
            os.write(2, "".join(line + "\n" for line in lines).encode(errors="replace"))


class Guards:
    """The workdir's guard, the git dirs', the live watcher and its gate, as far as begun."""

    def __init__(self) -> None:
        self.hostrun: hostrun_guard.Guard | None = None  # scan at start, sweep at the end
        self.gitdirs: list[hostrun_guard.Guard] = []  # the same, for git dirs outside it
        self.live: Watcher | None = None  # the host-run guard while CMD runs
        self.gate: Gate | ServiceGate | None = None  # the live gate, where there is one
        self._closing: Watcher | None = None  # the live guard, its inotify group closing
        self._held: Gate | None = None  # our own gate, whose group closes last

    def begin(self, cfg: Config, root: str) -> None:
        """The scans start in threads while the servers start (each leaves its snapshot
        in the runtime dir ``root`` for the janitor).  An empty .git/hooks first, so that
        the scan finds it to hold; what a dead session left is repaired (:meth:`_repair`)."""
        gitdir_guard.prepare_workdir(cfg)
        state = hostrun_guard.state_dir(cfg.home)
        self._repair(state)
        self.hostrun = hostrun_guard.Guard(cfg.workdir, config.hostrun_table(cfg), root, state)
        if cfg.git_dirs:  # a linked worktree's common dir, a submodule's git dir
            self.gitdirs = gitdir_guard.start(cfg, root, state)

    @staticmethod
    def _repair(state: str) -> None:
        """Configs a dead session left as links become files again (hostrun_gitconfig);
        the live gate's binds of one that died with its janitor go (hostrun_binds), before
        this session's gate binds the workdir."""
        from libbroker.launcher import hostrun_binds, hostrun_gitconfig, runtime_dir

        say(hostrun_gitconfig.repair(state))
        cwd = os.getcwd()
        lines = hostrun_binds.repair(runtime_dir.session_dirs())
        if lines:  # our working directory may have been on a bind now detached: the path's
            say(lines)
            with contextlib.suppress(OSError):
                os.chdir(cwd)

    def wait(self) -> hostrun_guard.Snapshot:
        """Every host-run file fingerprinted: the workdir's snapshot."""
        assert self.hostrun is not None
        snap = self.hostrun.wait()
        for guard in self.gitdirs:
            guard.wait()
        return snap

    def begin_live(self, cfg: Config, snap: hostrun_guard.Snapshot, root: str, *,
                   swap: bool) -> Watcher:
        """The live guard (not started yet); ``swap``: each config a link to the host's."""
        from libbroker.launcher import hostrun_live

        swap = swap and not cfg.workdir_read_only  # nothing to write: the file stays
        try:
            self.live = hostrun_live.begin(snap, hostrun_guard.state_dir(cfg.home), root,
                                           swap=swap)
        except OSError as exc:
            raise LaunchError(f"cannot set up the live guard of the workdir's git configs: "
                              f"{exc.strerror or exc}") from None
        return self.live

    def begin_gate(self, snap: hostrun_guard.Snapshot, root: str) -> None:
        """The live gate, before the sandbox's mount namespace copies the host's: through
        the gate service when its socket is there (hostrun_gate_client: every host open's
        wait bounded, even with this launcher stopped), else fanotify in the launcher
        (root), else the watcher guards alone (said when a gate could not start)."""
        from libbroker.launcher import fanotify
        from libpolicy.hostrun_gate_service import socket_path

        if os.environ.get("AGENT_SANDBOX_LIVE_GATE") == "off":
            return
        assert self.live is not None
        path = socket_path(os.environ)
        with contextlib.suppress(OSError):
            if path and stat.S_ISSOCK(os.stat(path).st_mode):
                from libbroker.launcher.hostrun_gate_client import GateRefused, ServiceGate

                gate = ServiceGate(snap, self.live, path)
                try:
                    gate.start()
                    self.gate = gate
                    return
                except (OSError, GateRefused) as exc:
                    why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
                    if not fanotify.available():
                        say([f"agent-sandbox: the live gate is off in this session ({why}); "
                             "the watcher guards alone"])
                        return
                    say([f"agent-sandbox: the gate service did not gate this session ({why}); "
                         "the launcher's own gate instead"])
        if not fanotify.available():
            return  # no service here: the watcher alone, as doctor says
        from libbroker.launcher.hostrun_gate import Gate

        own = Gate(snap, self.live, root)  # its record lives as long as the janitor may need it
        try:
            own.start()
        except OSError as exc:
            say([f"agent-sandbox: the live gate is off in this session "
                 f"({exc.strerror or exc}); the watcher guards alone"])
            return
        self.gate = own

    def end(self, *, join: bool = True) -> None:
        """Configs merged back and files again, the sweep, the git dirs', then the gate,
        which guarded the host's opens through the sweep; idempotent.  ``join``: wait for
        the watcher's inotify group to be closed (else :meth:`closed` does, later)."""
        quiet = None
        live = self.live
        if live is not None:
            self._closing = live
        # The watcher's inotify group is closed in a thread (dropping 5k watches is 7 to
        # 18 ms of the kernel's CPU), and a close that frees fsnotify connectors waits for
        # a normal SRCU grace period, 8 to 25 ms (fanotify.Fanotify.flush_mounts: the
        # connectors' and the marks' waits, asked at once).  Without a gate: at once, while
        # the configs go back and the sweep runs.  With our own: after the gate's end, its
        # group holding the watched directories' connectors from the watcher's stop
        # (Gate.hold): the close frees none and waits for an expedited grace period (under
        # a millisecond); the connectors go while the runtime dir is removed (closed).
        keep = self.gate is not None
        # Our own gate (root's), not the service's: its group is ours to hold.
        own = cast("Gate", self.gate) if hasattr(self.gate, "hold") else None
        try:
            if live is not None:  # configs merged and files again, before the sweep
                from libbroker.launcher import hostrun_live

                # Through the gate's own way beneath its binds: its opens do not wait on it.
                under = self.gate.under if self.gate is not None else None
                say(hostrun_live.end(
                    live, self.hostrun.snap if self.hostrun else None, under, trace,
                    keep_group=keep, stopped=lambda: own.hold(live.watched()) if own else None))
                quiet = live.quiet_dirs()
                self.live = None
            if self.hostrun is not None:  # last: nothing of the session is alive to race it
                self.hostrun.finish(quiet=quiet)
                self.hostrun = None
                trace("host-run files swept")
            while self.gitdirs:  # a worktree's common dir, a submodule's git dir
                self.gitdirs.pop().finish()
        finally:
            # Last: it guarded the host's opens through the sweep.  On every path: a
            # failed sweep must not leave its binds on the workdir (its record goes with
            # the runtime dir after this).
            if own is not None and own.held:
                self._held = own  # its group, kept by stop(): closed() closes it
            if self.gate is not None:
                say(self.gate.stop())
                self.gate = None
                trace("live gate stopped")
            if live is not None:
                live.close_group()
                if self._held is not None:  # the close frees no connector: a short wait
                    live.closed()
                    self._held.release()
        if join:
            self.closed()

    def closed(self) -> None:
        """The watcher's inotify group closed (:meth:`end` began it), then the gate's
        group if it held connectors; idempotent.  The session calls it last, after its
        runtime dir is gone: a grace period passes meanwhile."""
        if self._closing is not None:
            self._closing.closed()
            self._closing = None
        if self._held is not None:  # the gate's group, last
            self._held.close()
            self._held = None
