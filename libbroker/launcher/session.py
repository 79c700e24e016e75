"""``agent-sandbox run``: one sandboxed session, start to finish.

The order is chosen for latency: everything slow starts at once and the
launcher does its own work while it waits.

0. (before this module: :mod:`.prestart`) the servers' listening sockets are
   made (:mod:`.handoff`) and egress-proxy is spawned with its two first thing,
   and imports what it needs while the launcher parses its command line and
   config;
1. runtime directory (0700) and the janitor (cleanup if we are SIGKILLed);
   the broker's socket bound there and listening (broker-server itself starts
   on its first connection, :mod:`.lazy_broker`); (Landlock) the sandbox
   helper, whose interpreter starts meanwhile;
2. the proxy gets its arguments, the broker's are computed once its profile
   is written and the sign key known; git's gpg.program script is written;
   (bwrap) the sandbox (bwrap + forwarder) is built and waits for a go byte,
   so CMD never runs before the session is whole; the policy JSON;
3. read the proxy's ``listening`` lines: its CA is written (timeout; its
   stderr in the error); the sockets listen already, nothing else is waited for;
4. (Landlock) write the policy JSON; proxify the kubeconfig; start relaying;
5. go (unless a child died meanwhile); then relay signals, start the broker
   on its first connection, watch for a crash, and end everything in order:
   the sandbox, the broker, the proxy; remove the runtime directory.

Each step that makes something registers its end on the session's
:class:`contextlib.ExitStack` as it begins (trio's rule: whoever starts it owns
its end), so the teardown is the children's end, then that stack closed: the
last made is undone first, and a start cut short undoes just what it made.
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import TYPE_CHECKING

from libbroker.errors import LaunchError
from libbroker.launcher import (
    agent_sandbox,
    agent_session,
    boot,
    config_file,
    install,
    plan,
    prestart,
    runtime_dir,
    session_box,
    session_guards,
    session_poll,
    session_service,
    supervise,
    trace,
)
from libbroker.launcher.agent_sandbox import SOCKS_PORT, Host
from libbroker.launcher.config import Config
from libbroker.launcher.here import here
from libbroker.launcher.lazy_broker import LazyBroker
from libbroker.launcher.runtime import Runtime
from libbroker.launcher.servers import ServerPipes
from libbroker.launcher.trace import trace as _trace
from libbroker.sandbox.kinds import choose_backend

if TYPE_CHECKING:
    import subprocess

    from libbroker.launcher.child import Proc
    from libbroker.launcher.handoff import Sockets
    from libbroker.launcher.record import SessionRecord
    from libbroker.sandbox.cgroups import Group

class Session:
    """One run: its steps in order, each owning its end (:meth:`_start`, :meth:`_teardown`)."""

    def __init__(
        self, cfg: Config, cmd: list[str], backend: str, servers: prestart.Servers | None = None
    ) -> None:
        self.cfg = cfg
        self.cmd = cmd
        # The servers' processes and sockets, the service's link, the lazy broker:
        # prestarted, or started by the session.
        self.servers = servers
        self.box = session_box.BOXES[choose_backend(backend)](self)  # the backend's part
        self.signals = supervise.Signals()  # caught for CMD until passed on
        self.crew = supervise.Crew()  # the children, the sandbox among them, the janitor
        self.pipes = ServerPipes()  # the servers' pipes and their lines, the session's poller
        self.rt: Runtime | None = None
        self.guards = session_guards.Guards()  # the host-run guards: scan, live, gate, sweep
        self.agent: agent_session.Agent | None = None  # the agent profile's part
        self.record: SessionRecord | None = None  # the session record, from go to the end

    # --- the whole run -------------------------------------------------------

    def run(self) -> int:
        with self.signals.caught():
            ends = contextlib.ExitStack()  # each start step's end, registered as it begins
            try:
                self._start(ends)
            except BaseException:
                self._teardown(ends)
                if self.signals.pending:  # a signal ended the start: the shell's status for it
                    os.write(2, b"agent-sandbox: interrupted while starting\n")
                    return 128 + self.signals.pending[0]
                raise
            return self._supervise(ends)

    # --- start ---------------------------------------------------------------

    def _start(self, ends: contextlib.ExitStack) -> None:
        cfg = self.cfg
        domains = cfg.domains  # as configured: an agent's hosts join later (the record)
        ends.callback(self._end_trace)
        ends.callback(self.pipes.close_log)
        if self.servers is not None:  # ours from now on, whatever happens
            self._take(self.servers)
            ends.callback(prestart.drop_helper, self.servers)  # one no box took
        if not os.path.isdir(cfg.workdir):
            raise LaunchError(f"workdir {cfg.workdir} is not a directory")
        self.box.check()
        _trace("session starts (interpreter, imports, config before this)")
        self.box.begin()  # before the first thread of the session (guards.begin)
        rt = self._make_runtime(ends)
        # After the limits' end: the sweep is the last (the watcher's group closes
        # while the runtime dir goes: _leave_runtime joins it).
        ends.callback(self.guards.end, join=False)
        # The host-run files' scan runs in a thread while the servers start
        # (it leaves its snapshot in rt for the janitor); joined before go.
        self.guards.begin(cfg, rt.root)
        sockets = self._own_servers(rt)
        # egress-proxy's arguments before the limits and the sandbox's first
        # steps: the launcher waits for its `listening` line, not for those.
        git = self._proxy_arguments(ends, rt, sockets)
        self._make_limits(ends, rt)
        ends.callback(self.box.reap)  # what the command left, once the children are gone
        self.box.open()
        host, record_dir = self._broker_arguments(rt, sockets, git)
        self._write_gpg_program(host)
        found = self._build(rt, host)
        self._ready(rt)
        self._go(host, found)
        _trace("go")
        trace.mark("go")
        _collect_from_now()
        if record_dir:  # after go: the record never delays the command
            self._start_record(record_dir, domains)

    def _take(self, servers: prestart.Servers) -> None:
        """The prestarted servers (and the service's link) become the session's."""
        servers.taken = True
        self.crew.take(servers.proxy, servers.broker)

    def _make_runtime(self, ends: contextlib.ExitStack) -> Runtime:
        """The runtime directory (0700) and the janitor that cleans up if we are SIGKILLed.

        Outside the workdir (a session run from /tmp): the guard would sweep its files."""
        self.rt = rt = runtime_dir.create(os.path.realpath(self.cfg.workdir))
        ends.callback(self._leave_runtime, rt)
        self.crew.janitor = supervise.Janitor(rt.root)
        return rt

    def _leave_runtime(self, rt: Runtime) -> None:
        # Only now may the janitor go, and the runtime dir that holds the scan's
        # snapshot: a launcher killed during the merge or the sweep before this
        # leaves both, and the janitor finishes from the snapshot (each step idempotent).
        try:
            runtime_dir.remove(rt)
            if self.crew.janitor is not None:
                self.crew.janitor.dismiss()
                self.crew.janitor = None
        finally:
            self.guards.closed()  # the guards' last kernel waits ran meanwhile

    def _make_limits(self, ends: contextlib.ExitStack, rt: Runtime) -> None:
        """The sandbox's group (or rlimits), named in ``rt`` for the janitor.

        Made before any of the sandbox exists; the sandbox enters it before
        CMD runs (bwrap: the waiting tree is moved; Landlock: the command
        joins itself).  The servers and the launcher stay outside it.
        """
        from libbroker.sandbox import cgroups

        try:
            self.box.limits = group = cgroups.create(self.cfg.limits, "session")
            ends.callback(self._end_limits, group)
            cgroups.record(group, rt.root)
        except OSError as exc:
            raise LaunchError(
                f"cannot set the session's limits with {cgroups.mechanism().describe()}: "
                f"{exc.strerror or exc} (agent-sandbox doctor)"
            ) from None
        _trace("limits set")

    @staticmethod
    def _end_limits(group: Group) -> None:
        """Nothing of the session is left in its group: what it hit, then the group goes."""
        from libbroker.sandbox import cgroup_report, cgroups

        for hit in cgroup_report.report(group):
            os.write(2, f"agent-sandbox: the session hit its {hit}\n".encode())
        cgroups.remove(group)
        # A broker killed at once (nothing in flight) may leave the group of
        # its last command, still emptying then: groups of the gone go too.
        cgroups.reclaim()

    def _own_servers(self, rt: Runtime) -> Sockets:
        """The servers (started now if they were not), the janitor watching them; the
        broker's socket at its path: connections wait in its backlog from now on."""
        if self.servers is None:
            self.servers = prestart.start()
            self._take(self.servers)
        self.crew.watch_all()
        sockets = self.servers.sockets
        try:
            sockets.bind_broker(rt.broker_socket)
        except OSError as exc:
            raise LaunchError(f"cannot bind the broker's socket {rt.broker_socket}: "
                              f"{exc.strerror or exc}") from None
        return sockets

    def _proxy_arguments(self, ends: contextlib.ExitStack, rt: Runtime,
                         sockets: Sockets) -> Proc | None:
        """The agent's part, then egress-proxy's arguments (or the service's tenant);
        git's answer for the sign key comes meanwhile."""
        assert self.servers is not None
        cfg = self.cfg
        git = config_file.ask_sign_key(cfg)  # runs while the proxy gets its arguments
        self.agent = agent = agent_session.pick(cfg, self.cmd, os.environ)
        if agent is not None:  # its API and login hosts join the allow list
            ends.callback(self._write_back, agent, rt)
            self.cfg = cfg = agent.cfg
            self.cmd = agent.cmd
            _trace(f"{agent.profile.name}'s profile: argv, keys, login, hosts")
        if cfg.secrets:  # read by egress-proxy as it starts
            runtime_dir.write_private(rt.secrets, plan.secrets_json(cfg))
        servers = self.servers
        if servers.service is not None:  # a tenant of the resident gateway, if it can be
            servers.tenant = session_service.register(servers.service, cfg, rt)
        if not servers.tenant:
            if servers.proxy is None:  # the service cannot take this session, or is gone
                servers.proxy = self._late_proxy()
            servers.proxy.send_args(boot.encode_args(plan.proxy_args(cfg, rt, sockets.proxy_fds)))
        if agent is not None:  # its private config, while the servers start
            self.cfg = agent.prepare(rt)  # in a thread, traced; waited for before go
            _trace(f"{agent.profile.name}'s copy begun (its settings rendered)")
        return git

    def _broker_arguments(self, rt: Runtime, sockets: Sockets,
                          git: Proc | None) -> tuple[Host, str]:
        """broker-server's arguments, its profile written; the host's facts and where the
        session's record goes ("" when record = false)."""
        cfg = self.cfg
        host = install.host_facts(here())
        record_dir = ""
        if cfg.record:  # never where the sandbox could reach it: refused before anything runs
            from libbroker.launcher.record import check_private

            record_dir = check_private(cfg, host, rt.root)
        if cfg.learn:
            os.write(2, b"agent-sandbox: LEARN MODE: every public host is allowed and recorded; "
                        b"agent-sandbox report --propose prints the domains line\n")
        if cfg.protect_git and not cfg.workdir_read_only:  # the sweep's surprise, said first
            from libbroker.launcher.hostrun_guard import shared_workdir

            if (line := shared_workdir(cfg.workdir)) is not None:
                os.write(2, f"{line}\n".encode(errors="replace"))
        import json  # after the servers' spawn: nothing before it that need not be

        runtime_dir.write_private(rt.profile, json.dumps(plan.command_profile(cfg, host)))
        self.cfg = cfg = config_file.take_sign_key(cfg, git)
        if cfg.sign_problem:  # git would sign with a key this session cannot enable
            os.write(2, f"agent-sandbox: signing: {cfg.sign_problem}\n".encode(errors="replace"))
        broker_args = plan.broker_args(cfg, rt, self.box.kind, sockets.broker_fd)
        # broker-server starts on the first connection to its socket (lazy_broker):
        # ours, or the service's zygote's fork.
        assert self.servers is not None
        self.servers.lazy = LazyBroker(sockets, broker_args)
        _trace("servers have their arguments")
        return host, record_dir

    def _build(self, rt: Runtime, host: Host) -> plan.Listening:
        """The sandbox built while the servers start; the proxy's ports once it listens,
        the policy and the kubeconfig written for them."""
        fixed = self.box.fixed_ports()  # known before the proxy listens: used meanwhile
        kube = self._start_kubeconfig(rt, fixed[1]) if fixed else None
        self.box.build(host)
        _trace("servers and sandbox spawned")
        # The live guard and its gate while the proxy starts, not after: they need the
        # scan's snapshot, not its ports.  Go still follows them (:meth:`_ready`).
        self.box.ready(self.guards.wait())
        self.box.prepare(host)  # CMD's process as far as it goes without the proxy's ports
        if fixed:
            runtime_dir.write_private(rt.policy, plan.policy_json(self.cfg, rt, *fixed))
        found = session_poll.wait_listening(self)
        _trace(f"listening: http {found.http_port}, socks {found.socks_port}")
        trace.children({c.name: c.pid for c in self.crew.children})
        if not fixed:  # the command reaches the proxy's own ports
            kube = self._start_kubeconfig(rt, found.socks_port)
            runtime_dir.write_private(
                rt.policy, plan.policy_json(self.cfg, rt, found.http_port, found.socks_port)
            )
        if kube is not None:
            self._finish_kubeconfig(kube)
        return found

    def _ready(self, rt: Runtime) -> None:
        """The log from now on; the agent's copy done, the live guard (begun with every
        host-run file fingerprinted, in :meth:`_build`) watching: nothing is left but go."""
        self.pipes.start_log(self.cfg)
        if self.agent is not None:  # its private copy, made while the servers started
            self.agent.wait()
        if self.guards.live is not None:
            self.guards.live.wait_ready()  # every directory watched before go
        agent_session.write_cas(rt, os.environ)  # the proxy's CA exists once it listens
        _trace("host-run files fingerprinted")

    def _start_record(self, record_dir: str, domains: tuple[str, ...]) -> None:
        from libbroker.launcher.record import SessionRecord

        try:
            self.record = SessionRecord.start(record_dir, self.cfg, self.cmd, self.box.kind,
                                              domains)
        except OSError as exc:
            raise LaunchError(f"cannot create the session record in {record_dir}: "
                              f"{exc.strerror or exc} (or record = false)") from None
        _trace("record started")

    def _write_gpg_program(self, host: Host) -> None:
        """git's gpg.program for the session: gpg-shim, without a Python start where it can.

        With the native fast path built (libbroker.native), gpg.program is a
        link to it and the Python gpg-shim (started without site) waits beside
        it for everything but signing; else gpg.program is that script.
        """
        from libbroker.native import built, install_gpg_program

        assert self.rt is not None
        install_gpg_program(self.rt.gpg_program, host.python, host.project_dir, built("gpg-shim"))

    def env(self, host: Host, http_port: int, socks_port: int, tmpdir: str = "") -> dict[str, str]:
        assert self.rt is not None and self.servers is not None
        service = self.servers.service
        env = agent_sandbox.environment(
            self.cfg,
            self.rt,
            os.environ,
            bin_dir=host.bin_dir,
            http_port=http_port,
            socks_port=socks_port,
            kubeconfig=self.rt.kubeconfig if self.cfg.kubeconfig else "",
            tmpdir=tmpdir,
            credential=service.credential if service and self.servers.tenant else "",
        )
        return agent_session.environment(self.agent, env, self.rt, os.environ)

    def _start_kubeconfig(
        self, rt: Runtime, socks_port: int = SOCKS_PORT
    ) -> subprocess.Popen[bytes] | None:
        if not self.cfg.kubeconfig:
            return None
        import shutil  # only with a kubeconfig: not on every start (runtime_dir._NAME_CHARS)

        try:
            shutil.copyfile(self.cfg.kubeconfig, rt.kubeconfig)
            os.chmod(rt.kubeconfig, 0o600)
        except OSError as exc:
            raise LaunchError(
                f"cannot copy kubeconfig {self.cfg.kubeconfig}: {exc.strerror}"
            ) from None
        url = f"socks5://127.0.0.1:{socks_port}"
        import subprocess  # only with a kubeconfig: it costs the launcher ms to import

        return subprocess.Popen(
            [install.exe("kubeconfig-proxify"), "--proxy=" + url, "--in-place", rt.kubeconfig],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _finish_kubeconfig(self, proc: subprocess.Popen[bytes]) -> None:
        _, err = proc.communicate(timeout=self.cfg.start_timeout)
        if proc.returncode != 0:
            raise LaunchError(f"kubeconfig-proxify failed: {err.decode(errors='replace').strip()}")

    def _late_proxy(self) -> supervise.Child:
        """Our own egress-proxy after all (the service could not take the session)."""
        assert self.servers is not None
        sockets = self.servers.sockets
        try:
            sockets.make_proxy()
        except OSError as exc:
            raise LaunchError(f"cannot make the proxy's sockets: {exc.strerror or exc}") from None
        proxy = prestart.start_proxy(sockets)
        self.crew.adopt(proxy, first=True)  # ended last, as a prestarted one
        return proxy

    def _go(self, host: Host, found: plan.Listening) -> None:
        """Let the command run, unless a child has died meanwhile (the servers are not
        waited for: one may have failed since, and the sandbox with it)."""
        dead = self.crew.exited()
        if dead is not None:
            raise session_poll.died_starting(self, dead)
        try:
            self.box.go(host, found)
        except BrokenPipeError:  # the sandbox died just now: its status says why
            assert self.crew.sandbox is not None
            raise session_poll.died_starting(self, self.crew.sandbox) from None

    # --- the session ---------------------------------------------------------

    def _supervise(self, ends: contextlib.ExitStack) -> int:
        """Until CMD ends (:func:`.session_poll.until_end`), then the end. Its status."""
        status, crash = session_poll.until_end(self)
        self.pipes.drain_all(self.record)  # the servers' last log lines before they go
        self._teardown(ends)
        if self.record is not None:
            self.record.end(1 if crash is not None else status, crash)
            self.record = None
        if crash is not None:
            raise LaunchError(crash + "; the session was ended")
        return status

    # --- the end -------------------------------------------------------------

    def _teardown(self, ends: contextlib.ExitStack) -> None:
        """The children end first (everything else is theirs to use), then what each
        start step made, the last made first; idempotent."""
        with ends:
            self._end_children()

    def _end_children(self) -> None:
        """The sandbox, the broker, the proxy; the service's link; what the box holds."""
        box = self.box
        box.cut()  # a sandbox still waiting to start never starts
        self.crew.end(box.signal, between=box.stop)  # the bridges end while the servers exit
        if self.record is not None:  # their last events, written as they ended
            self.pipes.drain_all(self.record)
        self._leave_service()
        box.release()
        self.crew.close()
        if self.servers is not None:  # a broker's socket never handed over: our copy
            self.servers.sockets.close()
        _trace("children ended")

    def _leave_service(self) -> None:
        service = self.servers.service if self.servers is not None else None
        if service is None:
            return
        # The link's end removes the tenant (the gateway closes its record) and
        # ends what the zygote's broker left: after our own SIGTERM's grace.
        service.close()
        # The tenant's last record lines, until the gateway's close.
        if self.pipes.tenant_out is not None:
            self.pipes.tenant_out.drain(lambda fd: self.pipes.read_lines(fd, self.record))
        service.close_record()
        assert self.servers is not None
        self.servers.service = None

    def _write_back(self, agent: agent_session.Agent, rt: Runtime) -> None:
        """The sandbox is gone: what is safe of the agent's config comes back."""
        from libbroker.launcher import agent_home

        with contextlib.suppress(LaunchError):  # a start cut short: the copy ends first
            agent.wait()
        agent.join()  # its record written
        for problem in agent_home.write_back(rt.root, keep=True):
            os.write(2, f"agent-sandbox: not written back: {problem}\n".encode())
        _trace(f"{agent.profile.name}'s config written back")

    def _end_trace(self) -> None:
        _trace("clean")
        trace.split(os.path.basename(self.cmd[0]) if self.cmd else "the command")


def _collect_from_now() -> None:
    """The cyclic collector on again (off since ``run`` began: bin/agent_sandbox.main):
    what the start made is frozen, never traversed again (the session's later
    collections do not pay for it, nor copy its pages in a fork); the session
    collects its own cycles as any program does."""
    gc.freeze()
    gc.enable()


def run(
    cfg: Config, cmd: list[str], backend: str, servers: prestart.Servers | None = None
) -> int:
    """Run ``cmd`` in a whole sandboxed session; its exit status.

    ``servers`` (from :func:`prestart.try_start`) are taken over if given;
    otherwise the session starts them itself.
    """
    return Session(cfg, cmd, backend, servers).run()
