"""The servers' listening sockets: made by the launcher, handed to the servers.

Socket activation (docs/fast-start.md): the launcher creates each socket the
session will use before it spawns the servers, and passes it to them as an
inherited descriptor (egress-proxy ``--listen-fd``/``--socks-fd``,
broker-server ``--socket-fd``).  The address is therefore known at once, and
a connection made before a server serves is not refused: it waits in the
socket's backlog until the server accepts it.  The session no longer waits
for a server to listen before it lets the command run.

- the proxy's two TCP sockets are bound (127.0.0.1, a free port) and listen
  here, before the spawn;
- the broker's unix socket is created here, unbound: its path is in the
  runtime directory, which does not exist yet.  The session binds it there
  (mode 0600) and makes it listen once that directory is made
  (:meth:`Sockets.bind_broker`), and starts broker-server with it only when
  the first connection arrives (:mod:`.lazy_broker`): a session that brokers
  nothing never pays for its interpreter.

Every descriptor here is close-on-exec: only the spawn that names it passes
it (``pass_fds``), so no other child (the sandbox above all) inherits one.
The launcher closes its own copies once handed over, so a server that dies
takes its sockets with it and a waiting connection is reset, not left hanging.

Light on purpose (``_socket``, the C module): :mod:`.prestart` imports it
before anything else.
"""

from __future__ import annotations

import _socket
import contextlib
import os

BACKLOG = 1024  # as egress-proxy's own bind; the broker's was 512


class Sockets:
    """The proxy's HTTP and SOCKS listeners and the broker's socket, until handed over."""

    def __init__(self, *, proxy: bool = True) -> None:
        """``proxy``: make the proxy's listeners too (not when the resident service serves)."""
        self.http: _socket.socket | None = None
        self.socks: _socket.socket | None = None
        self.broker: _socket.socket | None = None
        self.http_port = self.socks_port = 0
        self.broker_path = ""
        self.proxy_fds = (-1, -1)
        try:
            self.broker = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            if proxy:
                self.make_proxy()
        except OSError:
            self.close()
            raise
        # The number the broker gets it as (pass_fds keeps it), still
        # meaningful in its arguments once our copy is closed.
        self.broker_fd = self.broker.fileno()

    def make_proxy(self) -> None:
        """The proxy's two listeners (at the start, or late: the service could not serve)."""
        self.http, self.http_port = _listening_tcp()
        self.socks, self.socks_port = _listening_tcp()
        self.proxy_fds = (self.http.fileno(), self.socks.fileno())

    def proxy_taken(self) -> None:
        """egress-proxy holds its listeners now: our copies go (their ports stay known)."""
        for sock in (self.http, self.socks):
            if sock is not None:
                sock.close()
        self.http = self.socks = None

    def bind_broker(self, path: str) -> None:
        """Bind the broker's socket at ``path`` (mode 0600) and make it listen.

        ``path`` is in the session's fresh 0700 runtime directory: nobody else
        can reach it even before the chmod.  The umask is not touched (other
        threads of the launcher create files meanwhile).  Our copy stays until
        the broker is started (:meth:`broker_taken`): the session starts it on
        the first connection (:mod:`.lazy_broker`).  OSError if it fails.
        """
        sock = self.broker
        assert sock is not None
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
        self.broker_path = path

    def broker_taken(self) -> None:
        """broker-server holds its socket now: our copy goes."""
        if self.broker is not None:
            self.broker.close()
            self.broker = None

    def close(self) -> None:
        """Our copies, whatever is left of them (idempotent)."""
        for sock in (self.http, self.socks, self.broker):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        self.http = self.socks = self.broker = None


def _listening_tcp() -> tuple[_socket.socket, int]:
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(BACKLOG)
        return sock, sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
