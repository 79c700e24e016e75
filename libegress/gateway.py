"""egress-proxy as a gateway: one process, many tenants (``--control=PATH``).

Each tenant is a :class:`Services` of its own, built from its own options by
the same checks as the command line: allow list, address rules, inject hosts
with a CA of its own (name-constrained to them), secrets and their runners,
``repos``, record stream, and a log whose lines name it.  A connection
belongs to no tenant until its credential is checked
(:mod:`libegress.proxyauth`); from then on every decision on it is taken with
that tenant's services only, so nothing of one tenant (a secret, a record
line, a leaf) can reach another's traffic.  Removing a tenant forgets its
credential first, then cancels its connections and its runners.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from libbroker.errors import EgressError, UsageError
from libegress import proxyauth
from libegress.app import Options, log_stream, options_from_args, raise_fd_limit
from libegress.ca import LeafCache, make_authority
from libegress.context import Services, upstream_context
from libegress.control_frames import Add, policy_args
from libegress.egress_dir import write_egress_dir
from libegress.eventlog import EventLog
from libegress.heads import HttpError
from libegress.limits import Limits
from libegress.listen import announce_lines, bind
from libegress.proxyauth import BadCredentials, Credentials, TenantFull
from libegress.record import Recorder
from libegress.route import EgressPolicy
from libegress.scope import Scope
from libegress.server import HANDLERS, ProxyServer
from libegress.tokens import TokenKeeper, keep_all, secret_keepers, start_all

MAX_TENANTS = 4096
REMOVE_WAIT = 5.0  # seconds a removed tenant's connections get to finish their cancellation


@dataclass(eq=False)
class Tenant:
    """One sandbox served by the gateway."""

    name: str
    digest: bytes
    services: Services
    max_connections: int = 1024  # its share of the proxy's --max-conns ("max_conns")
    keeper: asyncio.Task[None] | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class Gate:
    """The tenants by name, their credentials, and who holds which connection."""

    def __init__(self, options: Options, stream: TextIO | None, limits: Limits,
                 check: Callable[[dict[str, Any]], Options] = options_from_args) -> None:
        self._options = options
        self._stream = stream
        self._limits = limits
        self._check = check
        self._upstream_tls: ssl.SSLContext | None = None
        self.tenants: dict[str, Tenant] = {}
        self._adding: set[str] = set()  # names whose add awaits its first reads

    def upstream(self) -> ssl.SSLContext:
        """One verifying context for every tenant's inject hosts (roots load once)."""
        if self._upstream_tls is None:
            self._upstream_tls = upstream_context(self._options.upstream_ca)
        return self._upstream_tls

    async def add(self, request: Add) -> dict[str, Any]:
        """Register a tenant; the reply's fields. UsageError/EgressError when refused."""
        name = request.tenant
        if name in self.tenants or name in self._adding:
            raise UsageError(f"tenant {name} exists: remove it first")
        if len(self.tenants) + len(self._adding) >= MAX_TENANTS:
            raise UsageError(f"at most {MAX_TENANTS} tenants")
        listen = self._options.listen
        options = self._check(policy_args(request.policy, f"{listen.host}:{listen.port}"))
        services, ca_pem = self._services(name, options, request.env)
        password = request.password or proxyauth.mint_password()
        share = (options.limits.max_connections if "max_conns" in request.policy
                 else self._limits.max_connections)
        tenant = Tenant(name, proxyauth.digest(password), services, share)
        # The name is held while the first token and secret reads run, so a second
        # add of it (another control client) is refused rather than raced.
        self._adding.add(name)
        try:
            await start_all(services.keepers())
        except BaseException:
            services.record.close()
            services.log.close_copy()
            raise
        finally:
            self._adding.discard(name)
        tenant.keeper = asyncio.create_task(keep_all(services.keepers()))
        self.tenants[name] = tenant
        services.log.note("tenant added")
        reply: dict[str, Any] = {"tenant": name, "user": name, "ca_pem": ca_pem}
        if request.password is None:
            reply["password"] = password  # minted: the caller's only copy
        return reply

    def _services(self, name: str, options: Options,
                  env: dict[str, str] | None = None) -> tuple[Services, str]:
        own = -1
        if options.log_file:  # the tenant's own copy of its lines (non-blocking, as the record)
            try:
                own = os.open(options.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                              | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
            except OSError as exc:
                raise UsageError(f"log {options.log_file}: {exc.strerror}") from None
        log = EventLog(self._stream, log_allowed=self._options.log_allowed, tenant=name,
                       copy_fd=own)
        try:
            record = Recorder.open(options.record_file, options.policy, tenant=name)
        except OSError as exc:
            log.close_copy()
            raise UsageError(f"record {options.record_file}: {exc.strerror}") from None
        if record.on:
            log.record = record
        authority = make_authority(list(options.policy.inject))
        try:
            if options.egress_dir:
                write_egress_dir(options.egress_dir, authority.cert_pem(),
                                 list(options.github_inject))
        except (OSError, EgressError) as exc:
            record.close()
            log.close_copy()
            raise UsageError(f"egress_dir {options.egress_dir}: {exc}") from None
        bound = self._options.token_timeout
        services = Services(
            policy=options.policy, limits=self._limits,
            leaves=LeafCache(authority, list(options.policy.inject)),
            tokens=TokenKeeper(options.token_argv, options.token_every, log.note, bound=bound,
                               env=env),
            log=log, upstream_ca=self._options.upstream_ca,
            secrets=secret_keepers(options.secrets, log.note, bound=bound, env=env),
            scope=(Scope(options.repos, frozenset(options.github_inject))
                   if options.repos is not None else None),
            record=record, upstream_tls=self.upstream(),
        )
        return services, authority.cert_pem().decode("ascii")

    async def remove(self, name: str) -> int:
        """Forget ``name``'s credential, end its connections and runners; how many ended."""
        tenant = self.tenants.pop(name, None)
        if tenant is None:
            raise UsageError(f"no tenant {name}")
        ended = list(tenant.tasks)
        for task in ended:
            task.cancel()
        if tenant.keeper is not None:
            tenant.keeper.cancel()
            ended_keeper: list[asyncio.Task[Any]] = [tenant.keeper]
        else:
            ended_keeper = []
        if ended or ended_keeper:
            await asyncio.wait([*ended, *ended_keeper], timeout=REMOVE_WAIT)
        tenant.services.log.note(f"tenant removed, {len(ended)} connection(s) closed")
        tenant.services.record.close()
        tenant.services.log.close_copy()
        return len(ended)

    async def close(self) -> None:
        for name in list(self.tenants):
            await self.remove(name)

    def admit(self, credentials: Credentials) -> Tenant | None:
        """The tenant these credentials name, or None (constant time in the password)."""
        tenant = self.tenants.get(credentials.user)
        ok = proxyauth.matches(tenant.digest if tenant else None, credentials.password)
        return tenant if ok else None

    def enter(self, tenant: Tenant) -> Services:
        """Count the running connection task as ``tenant``'s; its services."""
        task = asyncio.current_task()
        if task is not None and task not in tenant.tasks:
            if len(tenant.tasks) >= tenant.max_connections:
                raise TenantFull(f"more than {tenant.max_connections} connections of this "
                                 "tenant")
            tenant.tasks.add(task)
            task.add_done_callback(tenant.tasks.discard)
        return tenant.services

    def admit_http(self, headers: Iterable[tuple[bytes, bytes]],
                   bound: Tenant | None) -> Tenant:
        """The tenant of one HTTP request; HttpError 407 when there is none.

        A kept-alive connection stays with its first tenant: another
        credential on it is refused, not switched to.
        """
        values = [v for n, v in headers if n.lower() == b"proxy-authorization"]
        try:
            tenant = self.admit(proxyauth.parse_basic(values))
        except BadCredentials as exc:
            raise HttpError(407, str(exc), "proxy-auth") from None
        if tenant is None:
            raise HttpError(407, proxyauth.WRONG, "proxy-auth")
        if bound is not None and tenant is not bound:
            raise HttpError(407, proxyauth.CHANGED, "proxy-auth")
        try:
            self.enter(tenant)
        except TenantFull as exc:
            raise HttpError(503, str(exc)) from None
        return tenant


def serve_gateway(options: Options) -> int:
    """Run the gateway until SIGTERM/SIGINT; the exit status."""
    raise_fd_limit()
    assert options.control is not None
    with log_stream(options.log_file) as stream:
        log = EventLog(stream, log_allowed=options.log_allowed)
        listeners: list[tuple[socket.socket, str]] = [(bind(options.listen), "http")]
        if options.socks is not None:
            listeners.append((bind(options.socks), "socks5"))
        from libegress.control import open_control

        control = open_control(options.control)
        try:
            asyncio.run(_run(options, log, stream, listeners, control))
        finally:
            control.close()
    return 0


async def _run(options: Options, log: EventLog, stream: TextIO | None,
               listeners: list[tuple[socket.socket, str]], control: Any) -> None:
    gate = Gate(options, stream, options.limits)
    if options.upstream_ca:
        gate.upstream()  # as in the single-session mode: a bad CA file stops the start
    # The gateway's own services refuse everything: a connection is served
    # with its tenant's, once its credential is checked.
    base = Services(policy=EgressPolicy(allow=(), inject=()), limits=options.limits,
                    leaves=LeafCache(make_authority([]), []),
                    tokens=TokenKeeper(None, 300.0, log.note), log=log, gate=gate)
    server = ProxyServer(base)
    serving = asyncio.create_task(control.serve(gate, log))
    try:
        await server.run([(s, HANDLERS[scheme]) for s, scheme in listeners],
                         announce_lines(listeners))
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await gate.close()
