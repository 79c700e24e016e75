"""The session's sandbox on each backend: what :class:`.session.Session` asks of it, step by step.

The session runs one sequence for every backend and asks its :class:`Box` at
each step; only here do bwrap and Landlock differ (:data:`BOXES`, keyed by
:mod:`libbroker.sandbox.kinds`).  The steps, in the session's order:

- :meth:`Box.check`: refuse before anything starts when the backend cannot run;
- :meth:`Box.begin`: while the launcher still runs one thread (Landlock: its
  helper forked, the launcher's imports done and shared);
- :meth:`Box.open`: right after the servers' spawn (Landlock: the helper,
  whose interpreter starts meanwhile, and the broker's door);
- :meth:`Box.fixed_ports`: the proxy's ports inside, when they are known
  before the proxy listens (bwrap: its own network namespace, bridged);
- :meth:`Box.build`: the sandbox built while the servers start (bwrap:
  bwrap and the forwarder, waiting for the go byte);
- :meth:`Box.ready`: every host-run file fingerprinted (Landlock: the live
  guard begins, its git configs swapped where the helper can mount);
- :meth:`Box.prepare`: while the proxy starts, CMD's process made as far as
  it can be without the proxy's ports (Landlock: its mount namespace; its
  process, in the sandbox's group, was made at :meth:`Box.open`);
- :meth:`Box.go`: CMD runs (bwrap: the go byte; Landlock: the spec);
- :meth:`Box.signal`: a signal number for CMD (both: a byte on a pipe);
- :meth:`Box.cut`, :meth:`Box.stop`, :meth:`Box.release`: the children's end
  (around :meth:`.supervise.Crew.end`); :meth:`Box.reap`: the end the session
  registers for :meth:`Box.open`; each idempotent.

The Box owns what it makes (pipes, bridges, the door) and is handed the
sandbox's limits (:attr:`Box.limits`); the session's crew owns the sandbox's
process (a :class:`~.supervise.Child`), and the session the shared steps.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING

from libbroker.errors import LaunchError, SandboxUnavailable, SpawnError
from libbroker.launcher import agent_sandbox, agent_session, hostrun_guard, plan, prestart
from libbroker.launcher.agent_sandbox import HTTP_PORT, SOCKS_PORT, Host
from libbroker.launcher.session_guards import say
from libbroker.quick_thread import QuickThread
from libbroker.sandbox import backends
from libbroker.sandbox.kinds import BWRAP, LANDLOCK
from libbroker.sandbox.landlock_backend import ReaperLine

if TYPE_CHECKING:
    import signal
    from collections.abc import Callable

    from libbroker.launcher.door import Door
    from libbroker.launcher.session import Session
    from libbroker.sandbox.backend import Started
    from libbroker.sandbox.bwrap_backend import BwrapStart
    from libbroker.sandbox.cgroups import Group
    from libbroker.sandbox.shape import Shape
else:
    import _signal as signal  # the C module: see supervise.py


class Box:
    """One backend's part of a session (the base does nothing at each step)."""

    kind = ""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.started: Started | None = None  # its backend's start: CMD's signals, its release
        self.limits: Group | None = None  # the sandbox's resource limits (the session makes them)
        self.subreaper = False  # orphans below the launcher are killed at teardown

    def check(self) -> None:
        """SandboxUnavailable before anything starts, when this backend cannot run."""
        reason = backends.of(self.kind).unavailable()
        if reason is not None:
            raise SandboxUnavailable(reason)

    def begin(self) -> None:
        """Right after :meth:`check`, while this process runs one thread (a fork is safe)."""

    def open(self) -> None:
        """Right after the servers' spawn, before the session's own work.

        The launcher becomes a child subreaper: what a child of ours leaves
        when it dies (a token command egress-proxy was running when it was
        killed, with its group and what left it by setsid(); under Landlock
        what the command left when its helper was killed) is reparented to
        us, not to init, and :meth:`reap` kills it.
        """
        from libbroker.sandbox import reaper

        reaper.become_subreaper()
        self.subreaper = True

    def fixed_ports(self) -> tuple[int, int] | None:
        """(http, socks) as the command sees them, when known before the proxy listens."""
        return None

    def build(self, host: Host) -> None:
        """The sandbox built while the servers start; CMD waits for :meth:`go`."""

    def ready(self, snap: hostrun_guard.Snapshot) -> None:
        """Every host-run file is fingerprinted (``snap``); the live guard runs from here."""

    def prepare(self, host: Host) -> None:
        """After :meth:`ready`, while the proxy starts: what of CMD's start needs no port."""

    def go(self, host: Host, found: plan.Listening) -> None:
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """Pass ``sig`` to CMD: through the forwarder (bwrap) or the reaper (Landlock) while
        their pipe is open (:attr:`started`); else to the sandbox's process itself."""
        if self.started is not None and self.started.signal(sig):
            return
        if self.s.crew.sandbox is not None:
            self.s.crew.sandbox.send(sig)

    def cut(self) -> None:
        """First in the teardown: a sandbox still waiting to start never starts."""

    def stop(self) -> None:
        """The bridges stop accepting, while the servers exit."""

    def release(self) -> None:
        """The servers are gone: close the control pipe, the bridges and the door."""
        if self.started is not None:
            self.started.release()

    def reap(self) -> None:
        """After the children: whatever they left outside their groups (see :meth:`open`)."""
        if self.subreaper:
            from libbroker.sandbox import reaper

            # Not the janitor: it must outlive the merge and the sweep that follow.
            janitor = self.s.crew.janitor
            reaper.kill_below(os.getpid(), frozenset({janitor.pid}) if janitor else frozenset())


class BwrapBox(Box):
    """bwrap + the forwarder, built while the servers start; the proxy bridged into its netns."""

    kind = BWRAP

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.start: BwrapStart | None = None  # its pipes, the proxy's ports inside, the bridges
        self.settling: list[QuickThread] = []  # its tree settled before go (_settle)
        self.unsettled: list[BaseException] = []  # what stopped that, raised at go

    def fixed_ports(self) -> tuple[int, int]:
        return HTTP_PORT, SOCKS_PORT

    def build(self, host: Host) -> None:
        """The bwrap sandbox: built now, CMD started by the forwarder on the go byte."""
        s = self.s
        assert s.rt is not None
        rt = s.rt
        from libbroker.sandbox import bwrap, seccomp
        from libbroker.sandbox.bwrap_backend import BwrapStart

        prog = seccomp.program()
        if prog is None:
            raise SandboxUnavailable(f"no seccomp filter for {os.uname().machine}: cannot sandbox")
        self.start = self.started = start = BwrapStart(prog, held=True)  # the forwarder's go
        pin, hold, binds = self._holds()
        overlays = s.agent.overlays(rt) if s.agent is not None else ()
        env = s.env(host, HTTP_PORT, SOCKS_PORT)
        shape = agent_sandbox.bwrap_shape(
            s.cfg, rt, host, env, tty=s.signals.tty, pin=pin, hold=hold, overlays=overlays,
            binds=binds,
        )  # fmt: skip
        facts = bwrap.shape_facts(shape)  # every path stat'ed once, the workdir's included
        argv = agent_sandbox.bwrap_argv(
            shape, rt, host, s.cmd, facts=facts, control_fd=start.go_fd,
            seccomp_fd=start.seccomp_fd, info_fd=start.info_w, rlimits=self._own_rlimits(),
        )  # fmt: skip
        agent_sandbox.fits_bwrap(pin, hold, s.cmd, binds=binds, argv=argv)
        try:
            s.crew.sandbox = s.crew.spawn(
                "sandbox",
                argv,  # bwrap's --die-with-parent: it ends with the launcher
                env=env,
                pass_fds=start.pass_fds,
                pipes=False,
                ignore=(signal.SIGINT, signal.SIGQUIT) if s.signals.tty else (),
            )
        finally:
            start.spawned()
        if self.limits is not None and self.limits.kind != "rlimit":
            self._settle(self._move_tree)
        self._open_ports(start)

    def _own_rlimits(self) -> list[tuple[int, int]]:
        """Under rlimits, what the forwarder sets on itself before go (the command's parent:
        the go walk's prlimit alone can miss a fork in flight, see cgroups.move_tree).  It
        runs in bwrap's user namespace (``--unshare-all``; root without one is not held by
        RLIMIT_NPROC anyway), so RLIMIT_NPROC is the task limit itself."""
        group = self.limits
        if group is None or group.kind != "rlimit":
            return []
        from libbroker.sandbox import cgroups

        return cgroups.inner_rlimits(group.rlimits, group.limits.tasks)

    def _holds(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
        """What bwrap's mounts pin and hold read-only, and the private git configs it binds.

        The workdir's host-run files are held by mounts, which bwrap's argv
        names: the guard's scan (begun with the session) must be done.
        """
        s = self.s
        assert s.rt is not None
        guards = s.guards
        assert guards.hostrun is not None
        snap = guards.hostrun.wait()
        pin = tuple(hostrun_guard.bwrap_pin(snap))
        hold = tuple(hostrun_guard.bwrap_protect(snap))
        agent_sandbox.fits_bwrap(pin, hold, s.cmd)  # before the live configs' setup
        binds: tuple[tuple[str, str], ...] = ()
        if s.cfg.protect_git:  # each config: a link to the host's copy, the session's bound
            live = guards.begin_live(s.cfg, snap, s.rt.root, swap=True)
            live.start()  # its walk overlaps the servers' start; waited for before go
            guards.begin_gate(snap, s.rt.root)  # its mounts before bwrap's namespace copies them
            hold = tuple(p for p in hold if p not in live.configs.held_elsewhere())
            binds = tuple(live.configs.binds())
        if guards.gitdirs:  # their hooks and config held read-only, as the workdir's were
            from libbroker.launcher import gitdir_guard

            more_pin, more_hold = gitdir_guard.bwrap_holds(guards.gitdirs)
            pin, hold = pin + more_pin, hold + more_hold
        return pin, hold, binds

    def _open_ports(self, start: BwrapStart) -> None:
        """The proxy's two ports in the sandbox's netns (bridged at go), while the servers start.

        bwrap tells the sandbox's pid on its info fd once the namespaces
        exist; a bwrap that fails first closes it unsaid, and its status is
        reported as the session's wait for the servers reports a dead child.
        """
        inner = start.wait_inner()
        if inner is None:
            sandbox = self.s.crew.sandbox
            assert sandbox is not None
            raise LaunchError(
                f"{sandbox.name} exited with status {sandbox.proc.wait()} while starting "
                "(agent-sandbox doctor tells why)" + sandbox.error_tail()
            )
        # Its namespaces exist: the links are held once bwrap has built its mounts.
        self._settle(lambda: self._hold_config_links(inner))
        try:
            start.listen(inner, (HTTP_PORT, SOCKS_PORT))
        except SpawnError as exc:
            raise LaunchError(f"cannot open the proxy bridge: {exc}") from None

    def _settle(self, step: Callable[[], None]) -> None:
        """``step`` in a thread of its own, joined at go (:meth:`_settled`), while the proxy
        starts: bwrap's tree moved into the session's cgroups (from its spawn: the first
        write waits a kernel grace period, 5-30 ms of wall and no CPU), the config links
        held (from the sandbox's first process: a fork, once bwrap's mounts are built).
        Under rlimits the move waits for go: a process given the host's RLIMIT_NPROC
        before bwrap made its user namespace would pass that one on."""
        thread = QuickThread(self._settling, (step,), name="sandbox-settle")  # (no wait)
        thread.start()
        self.settling.append(thread)

    def _settling(self, step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException as exc:  # raised by go, on the main thread
            self.unsettled.append(exc)

    def _move_tree(self) -> None:
        sandbox = self.s.crew.sandbox
        if self.limits is not None and sandbox is not None:
            from libbroker.sandbox import cgroups

            cgroups.move_tree(self.limits, sandbox.pid)

    def _settled(self) -> None:
        """:meth:`_settle` done (its failure raised here); then the tree moved again: bwrap's
        tree waits for the go byte, nothing of CMD runs yet, and whatever the early move
        could not see is moved now (nothing, usually: then nothing is written)."""
        self._join_settling()
        if self.unsettled:
            raise self.unsettled.pop()
        self._move_tree()

    def _join_settling(self) -> None:
        while self.settling:
            self.settling.pop().join()

    def go(self, host: Host, found: plan.Listening) -> None:
        start = self.start
        assert start is not None and start.listeners  # opened in build, or the start failed
        self._settled()
        start.go((found.http_port, found.socks_port), b"g", keep=True)  # then signal numbers

    def _hold_config_links(self, inner: int) -> None:
        """Each config link a mount point inside, so the command cannot put a file
        of its own there (libbroker.sandbox.holdlink); else the watcher puts it back."""
        s = self.s
        live = s.guards.live
        links = tuple(sorted(live.configs.held_elsewhere())) if live else ()
        if not links or s.crew.sandbox is None:
            return
        from libbroker.sandbox import holdlink

        try:
            holdlink.hold_in(inner, links, s.cfg.start_timeout)
        except OSError as exc:
            say([f"agent-sandbox: the git config links are only watched in this "
                 f"session, not held: {exc.strerror or exc}"])  # fmt: skip

    def stop(self) -> None:
        if self.start is not None:  # the sandbox is gone: its connections end too
            self.start.stop()

    def release(self) -> None:
        """No move or hold left in flight (a start cut short) once the sandbox is gone:
        before its cgroups are removed and what it left reaped (bounded: the hold's wait
        for bwrap's mounts ends with bwrap)."""
        self._join_settling()
        super().release()


class LandlockBox(Box):
    """A helper started at once that applies Landlock for the spec it is sent, then reaps.

    The proxy's ports are the host's (Landlock allows connect to them alone)
    and the broker is reached through the door (:mod:`.door`).
    """

    kind = LANDLOCK

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.spec = -1  # write end of the helper's parts (the last, the spec, at go)
        self.parts = 0  # how many of them were sent
        self.links: tuple[str, ...] = ()  # the config links held in its namespace (prepare)
        self.hold: tuple[str, ...] | None = None  # what it holds read-only (prepare: _hold)
        self.door: Door | None = None
        self.ns_probe = 0  # the mount namespace probe's pid (pidns.probe)
        self.binds: tuple[tuple[str, str], ...] = ()  # the private git configs, when mounted
        self.mounts = False  # the helper gets a mount namespace (pidns.probe said so)

    def begin(self) -> None:
        """The helper, a fork of the launcher now that its imports are done (most of the
        helper's too: shared, not imported again); it waits for its parts."""
        s = self.s
        if s.servers is not None and s.servers.helper is None:
            # If it cannot start here, open starts it and says what goes wrong.
            with contextlib.suppress(LaunchError):
                s.servers.helper = prestart.start_helper(own_group=not s.signals.tty)

    def open(self) -> None:
        # What the command leaves behind (setsid(), double forks) ends with
        # its PID namespace where one can be made, else the helper reaps and
        # kills it; should the helper be killed itself, the launcher, a child
        # subreaper (Box.open), inherits them and the teardown kills them
        # (libbroker.sandbox.reaper, libbroker.sandbox.pidns).
        super().open()
        if self.s.cfg.protect_git:  # can the helper bind the private git configs? (pidns)
            from libbroker.sandbox import pidns

            self.ns_probe = pidns.probe()
        self._start_helper()
        # The command's process now, in the sandbox's group (made before open): the
        # migration's grace period passes while the session starts, not after go.
        first: dict[str, object] = {"new_session": not self.s.signals.tty}
        if self.limits is not None:  # joined by the command's process itself (not the reapers)
            first["limits"] = self.limits.entry()
        self._part(first)

    def _start_helper(self) -> None:
        """The helper, forked at :meth:`begin`, or now; it waits for its parts."""
        s = self.s
        assert s.rt is not None and s.servers is not None
        from libbroker.launcher.door import Door

        helper = s.servers.helper  # forked at begin, else now
        s.servers.helper = None
        if helper is None:
            helper = prestart.start_helper(own_group=not s.signals.tty)
        self.spec = helper.spec
        self.started = ReaperLine(helper.life)  # then signal numbers for CMD, to its reaper
        self.door = Door(s.rt.broker_socket)
        s.crew.adopt(helper.child)
        s.crew.sandbox = helper.child

    def ready(self, snap: hostrun_guard.Snapshot) -> None:
        """The live guard: each config linked where the helper can mount (pidns.probe)."""
        s = self.s
        if not s.cfg.protect_git:
            return
        from libbroker.sandbox import pidns

        assert s.rt is not None
        mounts = pidns.probed(self.ns_probe) if self.ns_probe else False
        self.ns_probe = 0
        self.mounts = mounts and not s.cfg.workdir_read_only
        live = s.guards.begin_live(s.cfg, snap, s.rt.root, swap=mounts)
        self.binds = tuple(live.configs.binds())
        live.start()
        if mounts:  # the command's view is its own namespace's copy: the gate sees the host
            s.guards.begin_gate(snap, s.rt.root)

    def _hold(self) -> tuple[str, ...] | None:
        """What the helper's mount namespace (where the probe found one) holds read-only:
        the existing host-run entries, as bwrap holds them."""
        guards = self.s.guards
        snap = guards.hostrun.snap if guards.hostrun is not None else None
        if snap is None or not self.mounts or guards.live is None:
            return None
        elsewhere = guards.live.configs.held_elsewhere()
        hold = list(hostrun_guard.bwrap_protect(snap))
        if guards.gitdirs:  # a worktree's common dir, a submodule's git dir: as bwrap holds them
            from libbroker.launcher import gitdir_guard

            hold += gitdir_guard.bwrap_holds(guards.gitdirs)[1]
        return tuple(p for p in hold if p not in elsewhere)

    def _shape(self, host: Host, env: dict[str, str], write: tuple[str, ...] = (),
               ports: tuple[int, ...] = (), tmpdir: str = "") -> Shape:
        s = self.s
        assert s.rt is not None
        return agent_sandbox.landlock_shape(
            s.cfg._replace(write=(*s.cfg.write, *write)), s.rt, host, env, tty=s.signals.tty,
            ports=ports, tmpdir=tmpdir, binds=self.binds, links=self.links, hold=self.hold,
        )  # fmt: skip

    def prepare(self, host: Host) -> None:
        """The init makes its mount namespace now (after the live gate's binds, which its
        copy of the host's mounts holds) and the command's process enters it: only
        Landlock's rules and the exec wait for go."""
        live = self.s.guards.live
        self.links = tuple(sorted(live.configs.held_elsewhere())) if live else ()
        self.hold = self._hold()
        self._part({"shape": self._shape(host, {}).early().to_json()})

    def _part(self, part: dict[str, object], *, last: bool = False) -> None:
        """The helper's next part (:mod:`libbroker.sandbox.landlock_helper`); the spec last.

        A helper gone meanwhile: the wait for the proxy, or go, reports its status
        (a BrokenPipeError for go's part, which the session turns into that report)."""
        if self.spec < 0:
            return
        from libbroker.sandbox.parts import frame

        view = memoryview(frame(json.dumps(part).encode()))
        self.parts += 1
        try:
            while view:
                view = view[os.write(self.spec, view) :]
        except BrokenPipeError:
            if last:
                raise
        finally:
            if last:
                fd, self.spec = self.spec, -1
                os.close(fd)

    def go(self, host: Host, found: plan.Listening) -> None:
        s = self.s
        assert s.rt is not None and self.door is not None
        if self.parts < 2:
            self.prepare(host)
        tmpdir = os.path.join(s.rt.root, "tmp")
        os.mkdir(tmpdir, 0o700)
        env = s.env(host, found.http_port, found.socks_port, tmpdir)
        env[agent_sandbox.DOOR_ENV_VAR] = str(self.door.port)
        # The real home is not granted: every command gets a writable one of its own.
        env["HOME"] = home = agent_session.landlock_home(s.agent, s.cfg, s.rt)
        ports = (found.http_port, found.socks_port, self.door.port)
        # Its namespaces are the prepared ones (the helper's command checks it).
        shape = self._shape(host, env, (home,), ports, tmpdir)
        self._part({"shape": shape.to_json(), "argv": s.cmd}, last=True)

    def cut(self) -> None:
        if self.spec >= 0:  # a helper still waiting for a part: end of file ends it
            os.close(self.spec)
            self.spec = -1

    def release(self) -> None:
        super().release()
        if self.door is not None:
            self.door.close()
            self.door = None

    def reap(self) -> None:
        super().reap()  # what escaped the command's process group is ours now
        if self.ns_probe:  # a start that failed before it asked for the answer
            with contextlib.suppress(OSError):
                os.waitpid(self.ns_probe, 0)
            self.ns_probe = 0


BOXES: dict[str, type[Box]] = {BWRAP: BwrapBox, LANDLOCK: LandlockBox}
"""Each backend of :data:`libbroker.sandbox.kinds.AUTO_ORDER` and its part of a session."""
