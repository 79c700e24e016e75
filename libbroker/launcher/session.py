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
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import time
from typing import TYPE_CHECKING

from libbroker.errors import LaunchError
from libbroker.launcher import (
    agent_sandbox,
    agent_session,
    boot,
    config,
    config_file,
    gitdir_guard,
    hostrun_guard,
    install,
    plan,
    prestart,
    runtime_dir,
    session_box,
    session_service,
    supervise,
    trace,
)
from libbroker.launcher.agent_sandbox import SOCKS_PORT, Host
from libbroker.launcher.config import Config
from libbroker.launcher.lazy_broker import LazyBroker
from libbroker.launcher.runtime import Runtime
from libbroker.launcher.serve_link import Link
from libbroker.launcher.servers import ServerPipes
from libbroker.launcher.trace import trace as _trace
from libbroker.sandbox.kinds import choose_backend

if TYPE_CHECKING:
    import signal
    import subprocess

    from libbroker.launcher.hostrun_gate import Gate
    from libbroker.launcher.hostrun_live import Watcher
    from libbroker.launcher.record import SessionRecord
    from libbroker.sandbox.cgroups import Group
else:
    # The C module: signal.py's enum conversions cost the launcher ~1 ms of
    # CPU while the servers start, and nothing here needs its enums.
    import _signal as signal

# How long a child gets between SIGTERM and SIGKILL at the end of a session.
GRACE = 3.0
_SERVICE_GONE = ("the resident service (agent-sandbox serve) went away: the session has no "
                 "proxy any more")
_FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Session:
    """One run: owns the runtime directory, the children and the relays."""

    def __init__(
        self, cfg: Config, cmd: list[str], backend: str, servers: prestart.Servers | None = None
    ) -> None:
        self.cfg = cfg
        self.servers = servers
        self.cmd = cmd
        self.backend = choose_backend(backend)
        self.box = session_box.BOXES[self.backend](self)  # the backend's part of each step
        self.tty = os.isatty(0)
        self.children: list[supervise.Child] = []
        self.signals: list[int] = []
        self.rt: Runtime | None = None
        self.janitor: supervise.Janitor | None = None
        self.sandbox: supervise.Child | None = None
        self.pipes = ServerPipes()  # the servers' pipes and their lines, the session's poller
        self.lazy: LazyBroker | None = None  # broker-server until its first connection
        self.hostrun: hostrun_guard.Guard | None = None  # scan at start, sweep at the end
        self.live: Watcher | None = None  # the host-run guard while CMD runs (hostrun_live)
        self.gate: Gate | None = None  # its fanotify gate, where allowed (hostrun_gate)
        self.gitdirs: list[hostrun_guard.Guard] = []  # the same, for git dirs outside the workdir
        self.agent: agent_session.Agent | None = None  # the agent profile's part
        self.limits: Group | None = None  # the sandbox's resource limits
        self.record: SessionRecord | None = None  # the session record, from go to the end
        self._record_dir = ""  # where it goes ("" when record = false)
        self._domains = cfg.domains  # as configured: an agent's hosts join later (the record)
        self.service: Link | None = None  # the resident service's link (docs/serve.md)
        self._tenant = False  # the session's egress is a tenant of the service's gateway

    # --- the whole run -------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wake = signal.set_wakeup_fd(wake_w)
        old = {sig: signal.signal(sig, self._on_signal) for sig in _FORWARD}
        try:
            try:
                self._start(wake_r)
            except BaseException:
                self._teardown()
                if self.signals:  # a signal ended the start: the shell's status for it
                    os.write(2, b"agent-sandbox: interrupted while starting\n")
                    return 128 + self.signals[0]
                raise
            return self._supervise(wake_r)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wake)
            os.close(wake_r)
            os.close(wake_w)

    def _on_signal(self, sig: int, _frame: object) -> None:
        self.signals.append(sig)

    # --- start ---------------------------------------------------------------

    def _start(self, wake_r: int) -> None:
        cfg = self.cfg
        servers = self.servers
        if servers is not None:  # ours from now on, whatever happens
            servers.taken = True
            self._take(servers)
        if not os.path.isdir(cfg.workdir):
            raise LaunchError(f"workdir {cfg.workdir} is not a directory")
        self.box.check()
        _trace("session starts (interpreter, imports, config before this)")
        self.rt = rt = runtime_dir.create()
        self.janitor = supervise.Janitor(rt.root)
        self._make_limits(rt)
        # The host-run files' scan runs in a thread while the servers start
        # (it leaves its snapshot in rt for the janitor); joined before go.
        # An empty .git/hooks first, so that the scan finds it to hold.
        gitdir_guard.prepare_workdir(cfg)
        self._repair_configs()
        self.hostrun = hostrun_guard.Guard(
            cfg.workdir, config.hostrun_table(cfg), rt.root, hostrun_guard.state_dir(cfg.home)
        )
        if cfg.git_dirs:  # a linked worktree's common dir, a submodule's git dir
            self.gitdirs = gitdir_guard.start(cfg, rt.root, hostrun_guard.state_dir(cfg.home))
        if servers is None:
            self.servers = servers = prestart.start(self.backend)
            servers.taken = True
            self._take(servers)
        for child in self.children:
            self.janitor.watch(child)
        sockets = servers.sockets
        try:  # the broker's socket, at its path: connections wait in its backlog from now on
            sockets.bind_broker(rt.broker_socket)
        except OSError as exc:
            raise LaunchError(f"cannot bind the broker's socket {rt.broker_socket}: "
                              f"{exc.strerror or exc}") from None
        self.box.open()
        proxy = servers.proxy
        git = config_file.ask_sign_key(cfg)  # runs while the proxy gets its arguments
        self.agent = agent = agent_session.pick(cfg, self.cmd, os.environ)
        if agent is not None:  # its API and login hosts join the allow list
            self.cfg = cfg = agent.cfg
            self.cmd = agent.cmd
        if cfg.secrets:  # read by egress-proxy as it starts
            runtime_dir.write_private(rt.secrets, plan.secrets_json(cfg))
        if self.service is not None:  # a tenant of the resident gateway, if it can be
            self._tenant = session_service.register(self.service, cfg, rt)
        if not self._tenant:
            if proxy is None:  # the service cannot take this session, or is gone
                proxy = servers.proxy = self._late_proxy()
            proxy.send_args(boot.encode_args(plan.proxy_args(cfg, rt, sockets.proxy_fds)))
        if agent is not None:  # its private config, while the servers start
            self.cfg = cfg = agent.prepare(rt)  # in a thread, traced; waited for before go
        host = install.host_facts(os.getcwd())
        if cfg.record:  # never where the sandbox could reach it: refused before anything runs
            from libbroker.launcher.record import check_private

            self._record_dir = check_private(cfg, host, rt.root)
        if cfg.learn:
            os.write(2, b"agent-sandbox: LEARN MODE: every public host is allowed and recorded; "
                        b"agent-sandbox report --propose prints the domains line\n")
        import json  # after the servers' spawn: nothing before it that need not be

        runtime_dir.write_private(rt.profile, json.dumps(plan.command_profile(cfg, host)))
        self.cfg = cfg = config_file.take_sign_key(cfg, git)
        if cfg.sign_problem:  # git would sign with a key this session cannot enable
            os.write(2, f"agent-sandbox: signing: {cfg.sign_problem}\n".encode(errors="replace"))
        broker_args = plan.broker_args(cfg, rt, self.backend, sockets.broker_fd)
        # broker-server starts on the first connection to its socket (lazy_broker):
        # ours, or the service's zygote's fork.
        self.lazy = LazyBroker(sockets, broker_args)
        _trace("servers have their arguments")
        self._write_gpg_program(host)
        fixed = self.box.fixed_ports()  # known before the proxy listens: used meanwhile
        kube = self._start_kubeconfig(rt, fixed[1]) if fixed else None
        self.box.build(host)
        _trace("servers and sandbox spawned")
        if fixed:
            runtime_dir.write_private(rt.policy, plan.policy_json(cfg, rt, *fixed))
        found = self._wait_listening(proxy, wake_r)
        _trace(f"listening: http {found.http_port}, socks {found.socks_port}")
        trace.children({c.name: c.pid for c in self.children})
        if not fixed:  # the command reaches the proxy's own ports
            kube = self._start_kubeconfig(rt, found.socks_port)
            runtime_dir.write_private(
                rt.policy, plan.policy_json(cfg, rt, found.http_port, found.socks_port)
            )
        if kube is not None:
            self._finish_kubeconfig(kube)
        self.pipes.start_log(self.cfg)
        if self.agent is not None:  # its private copy, made while the servers started
            self.agent.wait()
        snap = self.hostrun.wait()  # CMD never runs before every host-run file is fingerprinted
        for guard in self.gitdirs:
            guard.wait()
        self.box.ready(snap)
        if self.live is not None:
            self.live.wait_ready()  # every directory watched before go
        agent_session.write_cas(rt, os.environ)  # the proxy's CA exists once it listens
        _trace("host-run files fingerprinted")
        self._go(host, found)
        _trace("go")
        trace.mark("go")
        if self._record_dir:  # after go: the record never delays the command
            from libbroker.launcher.record import SessionRecord

            try:
                self.record = SessionRecord.start(self._record_dir, self.cfg, self.cmd,
                                                  self.backend, self._domains)
            except OSError as exc:
                raise LaunchError(f"cannot create the session record in {self._record_dir}: "
                                  f"{exc.strerror or exc} (or record = false)") from None
            _trace("record started")

    def _repair_configs(self) -> None:
        """Configs a dead session left as links become files again (hostrun_gitconfig);
        the live gate's binds of one that died with its janitor go (hostrun_binds), before
        this session's gate binds the workdir."""
        from libbroker.launcher import hostrun_binds, hostrun_gitconfig

        self.say(hostrun_gitconfig.repair(hostrun_guard.state_dir(self.cfg.home)))
        cwd = os.getcwd()
        lines = hostrun_binds.repair(runtime_dir.session_dirs())
        if lines:  # our working directory may have been on a bind now detached: the path's
            self.say(lines)
            with contextlib.suppress(OSError):
                os.chdir(cwd)

    def begin_live(self, snap: hostrun_guard.Snapshot, root: str, *, swap: bool) -> Watcher:
        from libbroker.launcher import hostrun_live

        swap = swap and not self.cfg.workdir_read_only  # nothing to write: the file stays
        try:
            return hostrun_live.begin(snap, hostrun_guard.state_dir(self.cfg.home), root,
                                      swap=swap)
        except OSError as exc:
            raise LaunchError(f"cannot set up the live guard of the workdir's git configs: "
                              f"{exc.strerror or exc}") from None

    def begin_gate(self, snap: hostrun_guard.Snapshot, live: Watcher) -> None:
        """The live gate (fanotify: root), before the sandbox's mount namespace copies the
        host's; else the watcher guards alone (said when the gate could not start)."""
        from libbroker.launcher import fanotify
        from libbroker.launcher.hostrun_gate import Gate

        if os.environ.get("AGENT_SANDBOX_LIVE_GATE") == "off" or not fanotify.available():
            return
        assert self.rt is not None  # the record lives as long as the janitor may need it
        gate = Gate(snap, live, self.rt.root)
        try:
            gate.start()
        except OSError as exc:
            self.say([f"agent-sandbox: the live gate is off in this session "
                      f"({exc.strerror or exc}); the watcher guards alone"])
            return
        self.gate = gate

    @staticmethod
    def say(lines: list[str]) -> None:
        if lines:
            with contextlib.suppress(OSError):
                os.write(2, "".join(line + "\n" for line in lines).encode(errors="replace"))

    def _make_limits(self, rt: Runtime) -> None:
        """The sandbox's group (or rlimits), named in ``rt`` for the janitor.

        Made before any of the sandbox exists; the sandbox enters it before
        CMD runs (bwrap: the waiting tree is moved; Landlock: the command
        joins itself).  The servers and the launcher stay outside it.
        """
        from libbroker.sandbox import cgroups

        try:
            self.limits = cgroups.create(self.cfg.limits, "session")
            cgroups.record(self.limits, rt.root)
        except OSError as exc:
            raise LaunchError(
                f"cannot set the session's limits with {cgroups.mechanism().describe()}: "
                f"{exc.strerror or exc} (agent-sandbox doctor)"
            ) from None
        _trace("limits set")

    def spawn(
        self, name: str, argv: list[str], *, own_group: bool = False, **kw: object
    ) -> supervise.Child:
        child = supervise.spawn(name, argv, **kw)  # type: ignore[arg-type]
        child.own_group = own_group
        self.children.append(child)
        assert self.janitor is not None
        self.janitor.watch(child)
        return child

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
        assert self.rt is not None
        env = agent_sandbox.environment(
            self.cfg,
            self.rt,
            os.environ,
            bin_dir=host.bin_dir,
            http_port=http_port,
            socks_port=socks_port,
            kubeconfig=self.rt.kubeconfig if self.cfg.kubeconfig else "",
            tmpdir=tmpdir,
            credential=self.service.credential if self.service and self._tenant else "",
        )
        return agent_session.environment(self.agent, env, self.rt, os.environ)

    def _start_kubeconfig(
        self, rt: Runtime, socks_port: int = SOCKS_PORT
    ) -> subprocess.Popen[bytes] | None:
        if not self.cfg.kubeconfig:
            return None
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

    def _take(self, servers: prestart.Servers) -> None:
        """The prestarted servers (and the service's link) become the session's."""
        self.children += [c for c in (servers.proxy, servers.broker) if c is not None]
        self.service = servers.service

    def _late_proxy(self) -> supervise.Child:
        """Our own egress-proxy after all (the service could not take the session)."""
        assert self.servers is not None
        sockets = self.servers.sockets
        try:
            sockets.make_proxy()
        except OSError as exc:
            raise LaunchError(f"cannot make the proxy's sockets: {exc.strerror or exc}") from None
        proxy = prestart.start_proxy(sockets)
        self.children.insert(0, proxy)
        assert self.janitor is not None
        self.janitor.watch(proxy)
        return proxy

    def _adopt(self, child: supervise.Child) -> None:
        """A child the service's zygote forked for us: ours as a spawned one is."""
        self.children.append(child)
        assert self.janitor is not None
        self.janitor.watch(child)

    def _start_broker(self) -> None:
        """The first brokered connection waits in the backlog: broker-server starts now."""
        assert self.lazy is not None
        self.pipes.poller.unregister(self.lazy.fd)
        broker = self.lazy.start(self.spawn, self._adopt, self.service)
        self.pipes.watch(broker)
        self.pipes.poller.register(broker.pidfd, select.POLLIN)
        _trace("broker-server started: a first connection")

    def _wait_listening(self, proxy: supervise.Child | None, wake_r: int) -> plan.Listening:
        found = plan.Listening()
        deadline = time.monotonic() + self.cfg.start_timeout
        poller = self.pipes.poller
        if self.service is not None and self._tenant:  # the gateway's ports, for our tenant
            found.http_port, found.socks_port = self.service.reply(self.cfg.start_timeout)
            self.pipes.watch_tenant(self.service)
        for server in (proxy, self.servers.broker if self.servers else None):
            if server is not None:
                self.pipes.watch(server)
        for child in self.children:
            poller.register(child.pidfd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        if self.lazy is not None:
            poller.register(self.lazy.fd, select.POLLIN)
        # Only the proxy is waited for: its `listening` lines say its egress dir
        # (the CA the command trusts) is written.  Both servers' sockets listen
        # already (handed over, :mod:`.handoff`): a connection waits in the
        # backlog until its server accepts it, so the broker's own line comes
        # when it comes, and a server that dies later ends the session
        # (:meth:`_supervise`).
        while not (found.http_port and found.socks_port):
            left = deadline - time.monotonic()
            if left <= 0:
                late = proxy
                assert late is not None  # the service's ports came with its reply
                raise LaunchError(
                    f"{late.name} did not say 'listening' within {self.cfg.start_timeout:g}s"
                    + late.error_tail()
                )
            for fd, _ in poller.poll(int(left * 1000) + 1):
                if fd == wake_r:
                    os.read(wake_r, 512)
                    if self.signals:
                        raise LaunchError("interrupted while starting")
                    continue
                if self.lazy is not None and fd == self.lazy.fd:
                    self._start_broker()
                    continue
                dead = next((c for c in self.children if c.pidfd == fd), None)
                if dead is not None:
                    raise self._died_starting(dead)
                for line in self._read_lines(fd):
                    source, kind = self.pipes.owners[fd]
                    if kind == "out":
                        plan.parse_listening(source.name, line, found)
        assert self.servers is not None
        sockets = self.servers.sockets
        if proxy is not None and (found.http_port, found.socks_port) != (
            sockets.http_port, sockets.socks_port
        ):  # never: it serves what it was handed; if it did not, nothing goes on
            raise LaunchError(f"egress-proxy listens on {found.http_port} and "
                              f"{found.socks_port}, not on the ports it was handed")
        return found

    def _died_starting(self, dead: supervise.Child) -> LaunchError:
        """The error for a child that exited before go (the sandbox named first)."""
        if self.sandbox is not None and dead is not self.sandbox and (
            self.sandbox.exited() or self.sandbox.wait(0.5)
        ):  # the root cause when a server's probe of the sandbox failed too
            dead = self.sandbox
        self.pipes.drain_all(self.record)
        code = dead.proc.wait()
        hint = " (agent-sandbox doctor tells why)" if dead is self.sandbox else ""
        return LaunchError(
            f"{dead.name} exited with status {code} while starting{hint}" + dead.error_tail()
        )

    def _go(self, host: Host, found: plan.Listening) -> None:
        """Let the command run, unless a child has died meanwhile (the servers are not
        waited for: one may have failed since, and the sandbox with it)."""
        dead = next((c for c in self.children if c.exited()), None)
        if dead is not None:
            raise self._died_starting(dead)
        try:
            self.box.go(host, found)
        except BrokenPipeError:  # the sandbox died just now: its status says why
            assert self.sandbox is not None
            raise self._died_starting(self.sandbox) from None

    def _read_lines(self, fd: int) -> list[str]:
        """A server's complete lines on ``fd`` (:meth:`.servers.ServerPipes.read_lines`)."""
        return self.pipes.read_lines(fd, self.record)

    # --- the session ---------------------------------------------------------

    def _supervise(self, wake_r: int) -> int:
        """Until CMD ends: relay signals, notice a crashed server. Its status."""
        sandbox = self.sandbox
        assert sandbox is not None
        deadline: float | None = None
        status: int | None = None
        crash: str | None = None
        link = self.service
        if link is not None:  # its end (the service gone) ends the session: fail closed
            self.pipes.poller.register(link.fileno(), select.POLLIN)
        while status is None:
            timeout = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            events = self.pipes.poller.poll(timeout)
            if not events and deadline is not None:
                sandbox.send(signal.SIGKILL)  # grace spent
                deadline = None
            for fd, _ in events:
                if fd == wake_r:
                    os.read(wake_r, 512)
                    deadline = self._relay_signals(deadline)
                elif fd == sandbox.pidfd:
                    status = self._status(sandbox.proc.wait())
                    _trace(f"command ended: {status}")
                    trace.mark("ended")
                else:
                    why = self._server_event(fd, link, first=crash is None)
                    if why is not None:  # the first crash ends the session
                        crash = why
                        self._ask(signal.SIGTERM)
                        deadline = time.monotonic() + GRACE
        if crash is None:  # the command ended first: a server gone meanwhile is still told
            dead = next((c for c in self.children if c is not sandbox and c.exited()), None)
            crash = self._crashed(dead) if dead is not None else None
        self.pipes.drain_all(self.record)  # the servers' last log lines before they go
        self._teardown()
        if self.record is not None:
            self.record.end(1 if crash is not None else status, crash)
            self.record = None
        if crash is not None:
            raise LaunchError(crash + "; the session was ended")
        return status

    def _server_event(self, fd: int, link: Link | None, *, first: bool) -> str | None:
        """A server's pipe, the lazy broker's socket, the service's link or a child's
        exit: what it means for the session, a crash (only the ``first`` one is said)."""
        if fd in self.pipes.owners:
            self._read_lines(fd)
            return None
        if self.lazy is not None and fd == self.lazy.fd:
            try:
                self._start_broker()
            except LaunchError as exc:
                return str(exc) if first else None
            return None
        if link is not None and fd == link.fileno():
            self.pipes.unwatch(fd)
            if not first:
                return None
            self.pipes.drain_all(self.record)
            return _SERVICE_GONE
        dead = next((c for c in self.children if c.pidfd == fd), None)
        if dead is None:
            return None
        self.pipes.unwatch(fd)  # an exited child's pidfd stays readable: once is enough
        if not first:
            return None
        crash = self._crashed(dead)
        if link is not None and link.gone(0.5):  # the broker went with it
            crash = _SERVICE_GONE
        return crash

    def _crashed(self, dead: supervise.Child) -> str:
        """The line for a server that exited by itself: before it served, or after."""
        self.pipes.drain_all(self.record)
        code = dead.proc.wait()
        when = "" if dead.name in self.pipes.serving else ", while starting"
        return f"{dead.name} exited unexpectedly (status {code}{when})" + dead.error_tail()

    def _relay_signals(self, deadline: float | None) -> float | None:
        while self.signals:
            sig = self.signals.pop(0)
            if self.tty and sig in (signal.SIGINT, signal.SIGQUIT):
                # From the keyboard: the command (same foreground group) got
                # it too and decides; an interactive shell ignores it.
                continue
            self._ask(sig)
            if deadline is None:
                deadline = time.monotonic() + GRACE
        return deadline

    def _ask(self, sig: int) -> None:
        """Pass ``sig`` to CMD (its backend's way: :meth:`.session_box.Box.signal`)."""
        self.box.signal(sig)

    @staticmethod
    def _status(code: int) -> int:
        return 128 - code if code < 0 else code

    # --- the end -------------------------------------------------------------

    def _teardown(self) -> None:
        """End every child in order, remove the runtime directory; idempotent."""
        self.box.cut()
        if self.sandbox is not None and not self.sandbox.exited():
            self._ask(signal.SIGTERM)
            if not self.sandbox.wait(GRACE):
                self.sandbox.stop(signal.SIGKILL, 0)
        # Then the broker (its clients are gone with the sandbox), then the
        # proxy.  A server with nothing in flight (no child process: no
        # brokered command, no token command) holds no state of its own, so
        # SIGKILL ends it at once; a busy one gets SIGTERM to end its work.
        servers = [c for c in self.children if c is not self.sandbox]
        for child in reversed(servers):
            child.send(signal.SIGTERM if child.busy() else signal.SIGKILL)
        self.box.stop()  # its bridges end while the servers exit
        for child in reversed(servers):
            if not child.wait(5.0):
                child.stop(signal.SIGKILL, 0)
        if self.record is not None:  # their last events, written as they ended
            self.pipes.drain_all(self.record)
        if self.service is not None:
            # The link's end removes the tenant (the gateway closes its record) and
            # ends what the zygote's broker left: after our own SIGTERM's grace.
            self.service.close()
            # The tenant's last record lines, until the gateway's close.
            if self.pipes.tenant_out is not None:
                self.pipes.tenant_out.drain(self._read_lines)
            self.service.close_record()
            self.service = None
        self.box.release()
        for child in self.children:
            child.close()
        self.children = []
        if self.servers is not None:  # a broker's socket never handed over: our copy
            self.servers.sockets.close()
        _trace("children ended")
        if self.rt is not None and self.agent is not None:
            # The sandbox is gone: what is safe of the agent's config comes back.
            from libbroker.launcher import agent_home

            with contextlib.suppress(LaunchError):  # a start cut short: the copy ends first
                self.agent.wait()

            for problem in agent_home.write_back(self.rt.root):
                os.write(2, f"agent-sandbox: not written back: {problem}\n".encode())
            _trace(f"{self.agent.profile.name}'s config written back")
        self.box.reap()
        if self.limits is not None:  # nothing of the session is left in it
            from libbroker.sandbox import cgroups

            for hit in cgroups.report(self.limits):
                os.write(2, f"agent-sandbox: the session hit its {hit}\n".encode())
            cgroups.remove(self.limits)
            self.limits = None
            # A broker killed at once (nothing in flight) may leave the group of
            # its last command, still emptying then: groups of the gone go too.
            cgroups.reclaim()
        quiet = None
        live = self.live
        if live is not None:  # configs merged and files again, before the sweep
            from libbroker.launcher import hostrun_live

            # Through the gate's own way beneath its binds: its opens do not wait on it.
            under = self.gate.binds.under if self.gate is not None else None
            self.say(hostrun_live.end(live, self.hostrun.snap if self.hostrun else None,
                                      under, _trace))
            quiet = live.quiet_dirs()
            self.live = None
        if self.hostrun is not None:  # last: nothing of the session is alive to race it
            self.hostrun.finish(quiet=quiet)
            self.hostrun = None
            _trace("host-run files swept")
        if live is not None:
            live.closed()
        while self.gitdirs:  # a worktree's common dir, a submodule's git dir
            self.gitdirs.pop().finish()
        if self.gate is not None:  # last: it guarded the host's opens through the sweep
            self.say(self.gate.stop())
            self.gate = None
            _trace("live gate stopped")
        # Only now may the janitor go, and the runtime dir that holds the scan's
        # snapshot: a launcher killed during the merge or the sweep above leaves
        # both, and the janitor finishes from the snapshot (each step idempotent).
        if self.rt is not None:
            runtime_dir.remove(self.rt)
        if self.janitor is not None:
            self.janitor.dismiss()
            self.janitor = None
        self.pipes.close_log()
        _trace("clean")
        trace.split(os.path.basename(self.cmd[0]) if self.cmd else "the command")


def run(
    cfg: Config, cmd: list[str], backend: str, servers: prestart.Servers | None = None
) -> int:
    """Run ``cmd`` in a whole sandboxed session; its exit status.

    ``servers`` (from :func:`prestart.try_start`) are taken over if given;
    otherwise the session starts them itself.
    """
    return Session(cfg, cmd, backend, servers).run()
