"""The session's one poll, in its two phases: until the proxy listens, and until CMD ends.

The poller (:class:`.servers.ServerPipes`) watches the servers' pipes, the
children's pidfds, the signals' wake-up pipe, the lazy broker's socket and
the resident service's link.  What an event means depends on the phase:

- before go (:func:`wait_listening`): the proxy's ``listening`` lines are
  what the start waits for; a child's exit, or a signal, ends the start
  (:func:`died_starting` names the sandbox first, the root cause);
- after go (:func:`until_end`): signals are passed to CMD, and the first
  server that exits (or the service's link that ends) is a crash: CMD gets
  SIGTERM, then SIGKILL once the grace is spent, and the session ends.

In both, the first brokered connection starts broker-server (:func:`start_broker`).
"""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from libbroker.errors import LaunchError
from libbroker.launcher import plan, supervise, trace
from libbroker.launcher.trace import trace as _trace

if TYPE_CHECKING:
    import signal

    from libbroker.launcher.serve_link import Link
    from libbroker.launcher.session import Session
else:
    import _signal as signal  # the C module: see supervise.py

SERVICE_GONE = ("the resident service (agent-sandbox serve) went away: the session has no "
                "proxy any more")


def start_broker(s: Session) -> None:
    """The first brokered connection waits in the backlog: broker-server starts now."""
    assert s.servers is not None and s.servers.lazy is not None
    lazy = s.servers.lazy
    s.pipes.poller.unregister(lazy.fd)
    broker = lazy.start(s.crew.spawn, s.crew.adopt, s.servers.service)
    s.pipes.watch(broker)
    s.pipes.poller.register(broker.pidfd, select.POLLIN)
    _trace("broker-server started: a first connection")


def wait_listening(s: Session) -> plan.Listening:
    """The proxy's ports once it says ``listening`` (the service's, for its tenant)."""
    assert s.servers is not None
    servers = s.servers
    proxy, wake_r = servers.proxy, s.signals.wake
    found = plan.Listening()
    deadline = time.monotonic() + s.cfg.start_timeout
    poller = s.pipes.poller
    if servers.service is not None and servers.tenant:  # the gateway's ports, for our tenant
        found.http_port, found.socks_port = servers.service.reply(s.cfg.start_timeout)
        s.pipes.watch_tenant(servers.service)
    for server in (proxy, servers.broker):
        if server is not None:
            s.pipes.watch(server)
    for child in s.crew.children:
        poller.register(child.pidfd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    if servers.lazy is not None:
        poller.register(servers.lazy.fd, select.POLLIN)
    # Only the proxy is waited for: its `listening` lines say its egress dir
    # (the CA the command trusts) is written.  Both servers' sockets listen
    # already (handed over, :mod:`.handoff`): a connection waits in the
    # backlog until its server accepts it, so the broker's own line comes
    # when it comes, and a server that dies later ends the session
    # (:func:`until_end`).
    while not (found.http_port and found.socks_port):
        left = deadline - time.monotonic()
        if left <= 0:
            late = proxy
            assert late is not None  # the service's ports came with its reply
            raise LaunchError(
                f"{late.name} did not say 'listening' within {s.cfg.start_timeout:g}s"
                + late.error_tail()
            )
        for fd, _ in poller.poll(int(left * 1000) + 1):
            if fd == wake_r:
                os.read(wake_r, 512)
                if s.signals.pending:
                    raise LaunchError("interrupted while starting")
                continue
            if servers.lazy is not None and fd == servers.lazy.fd:
                start_broker(s)
                continue
            dead = s.crew.by_pidfd(fd)
            if dead is not None:
                raise died_starting(s, dead)
            for line in s.pipes.read_lines(fd, s.record):
                source, kind = s.pipes.owners[fd]
                if kind == "out":
                    plan.parse_listening(source.name, line, found)
    sockets = servers.sockets
    if proxy is not None and (found.http_port, found.socks_port) != (
        sockets.http_port, sockets.socks_port
    ):  # never: it serves what it was handed; if it did not, nothing goes on
        raise LaunchError(f"egress-proxy listens on {found.http_port} and "
                          f"{found.socks_port}, not on the ports it was handed")
    return found


def died_starting(s: Session, dead: supervise.Child) -> LaunchError:
    """The error for a child that exited before go (the sandbox named first)."""
    sandbox = s.crew.sandbox
    if sandbox is not None and dead is not sandbox and (
        sandbox.exited() or sandbox.wait(0.5)
    ):  # the root cause when a server's probe of the sandbox failed too
        dead = sandbox
    s.pipes.drain_all(s.record)
    code = dead.proc.wait()
    hint = " (agent-sandbox doctor tells why)" if dead is sandbox else ""
    return LaunchError(
        f"{dead.name} exited with status {code} while starting{hint}" + dead.error_tail()
    )


def until_end(s: Session) -> tuple[int, str | None]:
    """Until CMD ends: relay signals, notice a crashed server. Its status, and the crash."""
    sandbox = s.crew.sandbox
    assert sandbox is not None
    deadline: float | None = None
    status: int | None = None
    crash: str | None = None
    link = s.servers.service if s.servers is not None else None
    if link is not None:  # its end (the service gone) ends the session: fail closed
        s.pipes.poller.register(link.fileno(), select.POLLIN)
    while status is None:
        timeout = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        events = s.pipes.poller.poll(timeout)
        if not events and deadline is not None:
            sandbox.send(signal.SIGKILL)  # grace spent
            deadline = None
        for fd, _ in events:
            if fd == s.signals.wake:
                os.read(fd, 512)
                deadline = s.signals.relay(s.box.signal, deadline)
            elif fd == sandbox.pidfd:
                code = sandbox.proc.wait()
                status = 128 - code if code < 0 else code
                _trace(f"command ended: {status}")
                trace.mark("ended")
            else:
                why = _server_event(s, fd, link, first=crash is None)
                if why is not None:  # the first crash ends the session
                    crash = why
                    s.box.signal(signal.SIGTERM)
                    deadline = time.monotonic() + supervise.GRACE
    if crash is None:  # the command ended first: a server gone meanwhile is still told
        dead = s.crew.exited(but=sandbox)
        crash = _crashed(s, dead) if dead is not None else None
    return status, crash


def _server_event(s: Session, fd: int, link: Link | None, *, first: bool) -> str | None:
    """A server's pipe, the lazy broker's socket, the service's link or a child's
    exit: what it means for the session, a crash (only the ``first`` one is said)."""
    if fd in s.pipes.owners:
        s.pipes.read_lines(fd, s.record)
        return None
    lazy = s.servers.lazy if s.servers is not None else None
    if lazy is not None and fd == lazy.fd:
        try:
            start_broker(s)
        except LaunchError as exc:
            return str(exc) if first else None
        return None
    if link is not None and fd == link.fileno():
        s.pipes.unwatch(fd)
        if not first:
            return None
        s.pipes.drain_all(s.record)
        return SERVICE_GONE
    dead = s.crew.by_pidfd(fd)
    if dead is None:
        return None
    s.pipes.unwatch(fd)  # an exited child's pidfd stays readable: once is enough
    if not first:
        return None
    crash = _crashed(s, dead)
    if link is not None and link.gone(0.5):  # the broker went with it
        crash = SERVICE_GONE
    return crash


def _crashed(s: Session, dead: supervise.Child) -> str:
    """The line for a server that exited by itself: before it served, or after."""
    s.pipes.drain_all(s.record)
    code = dead.proc.wait()
    when = "" if dead.name in s.pipes.serving else ", while starting"
    return f"{dead.name} exited unexpectedly (status {code}{when})" + dead.error_tail()
