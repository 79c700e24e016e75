"""broker-server, started on the session's first brokered connection.

The launcher binds the broker's socket itself (:mod:`.handoff`), so it can
also wait to start the server until someone connects: the listening socket
is polled with the session's other descriptors, and its first readable event
(a connection in the backlog) spawns broker-server with that socket
(``--socket-fd``).  The connection waits in the backlog meanwhile and is
answered once the server runs; nothing is refused.  A session that brokers
nothing (most plain commands; an agent until it signs a commit or calls
broker-client) never pays for the broker's interpreter, its imports and its
sandbox probe, which were a third of a session's CPU at start.

The arguments are the ones the session computed at start (its profile and
sign key are written then); the server is the session's child from its
spawn on, like the others: watched by the janitor, ended at the teardown, and
its unexpected exit ends the session.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from libbroker.errors import LaunchError
from libbroker.launcher import boot
from libbroker.launcher.child import Child
from libbroker.launcher.handoff import Sockets
from libbroker.launcher.serve_link import Link
from libbroker.launcher.trace import trace

NAME = "broker-server"


class LazyBroker:
    """The broker's listening socket until its first connection, then its server."""

    def __init__(self, sockets: Sockets, args: list[str]) -> None:
        assert sockets.broker is not None, "bound and listening, not yet handed over"
        self._sockets = sockets
        self._args = args
        self.fd = sockets.broker.fileno()  # polled for a first connection; -1 once started

    def start(self, spawn: Callable[..., Child], adopt: Callable[[Child], None],
              link: Link | None = None) -> Child:
        """Spawn broker-server on the socket (``spawn``: the session's, which owns it).

        With the resident service's ``link``, its zygote forks the server instead
        (:mod:`.broker_zygote`; ``adopt`` makes that child the session's as
        ``spawn`` does its own); if the service cannot, it is spawned here.
        LaunchError if it cannot be spawned.  Our copy of the socket is closed
        once the server holds it: its exit then resets what waits in the backlog.
        """
        fd, self.fd = self.fd, -1
        # Brokered commands are part of the session: they see AGENT_SANDBOX=1 too.
        env = {**os.environ, "AGENT_SANDBOX": "1"}
        if link is not None:
            try:
                child = link.broker(env, fd)
            except LaunchError as exc:
                trace(f"the service's zygote gave no broker ({exc}): our own")
            else:
                adopt(child)
                self._sockets.broker_taken()
                child.send_args(boot.encode_args(self._args))
                return child
        argv = boot.deferred_python_argv(NAME, "bin.broker_server", ())
        try:
            child = spawn(NAME, argv, env=env, stdin_pipe=True, pass_fds=[fd])
        finally:
            self._sockets.broker_taken()
        child.send_args(boot.encode_args(self._args))
        return child
