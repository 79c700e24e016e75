"""egress-proxy once its listeners are made: the services, the first token, the loop.

Loaded after the proxy's ``listening`` line when its sockets were handed over
(:func:`libegress.app.serve`, docs/fast-start.md): asyncio, ssl, the server and
the token keepers cost it tens of ms of CPU that the launcher no longer waits
for.  A connection made meanwhile waits in the socket's backlog, and is
accepted once the first token is read, as before.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from libegress.ca import Authority, LeafCache
from libegress.context import Services
from libegress.eventlog import EventLog
from libegress.server import HANDLERS, ProxyServer
from libegress.tokens import TokenKeeper, secret_keepers

if TYPE_CHECKING:
    from libegress.app import Options  # app imports this module (after `listening`)


def run(options: Options, log: EventLog, authority: Authority,
        listeners: list[tuple[socket.socket, str]], announce: Callable[[], None]) -> None:
    """Serve on ``listeners`` until SIGTERM/SIGINT (``announce`` once accepting)."""
    leaves = LeafCache(authority, list(options.policy.inject))
    asyncio.run(_run(options, log, leaves, listeners, announce))


async def _run(options: Options, log: EventLog, authority_cache: LeafCache,
               listeners: list[tuple[socket.socket, str]],
               announce: Callable[[], None]) -> None:
    scope = None
    if options.repos is not None:  # only then: the scope's rules, urllib.parse and json
        from libegress.scope import Scope

        scope = Scope(options.repos, frozenset(options.github_inject))
    tokens = TokenKeeper(options.token_argv, options.token_every, log.note,
                         bound=options.token_timeout)
    services = Services(
        policy=options.policy,
        limits=options.limits,
        leaves=authority_cache,
        tokens=tokens,
        log=log,
        upstream_ca=options.upstream_ca,
        secrets=secret_keepers(options.secrets, log.note, bound=options.token_timeout),
        scope=scope,
    )
    if log.record is not None:
        services.record = log.record
    if options.upstream_ca:
        # A named CA file is read now, so a bad one stops the start; the
        # system's roots load on first use (Services.upstream_tls).
        services.load_upstream_tls()
    server = ProxyServer(services)
    await server.run([(s, HANDLERS[scheme]) for s, scheme in listeners], announce)
