"""The proxy's listeners: an address to bind or a socket handed over, and their ``listening`` lines.

Apart from :mod:`libegress.server` so that egress-proxy reaches its
``listening`` line without asyncio, the server and its handlers loaded
(docs/fast-start.md): they load after it, while the launcher starts the
command; a connection made meanwhile waits in the socket's backlog.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

from libbroker.errors import EgressError
from libbroker.named_tuple import NamedTuple
from libbroker.server_lines import listening_line
from libbroker.unix_listen import handed_over


class Listen(NamedTuple):
    """A listener's address and what it speaks (``http`` or ``socks5``).

    ``fd`` >= 0: a listening socket handed over by whoever started the proxy
    (``--listen-fd``, docs/fast-start.md); ``host`` and ``port`` are then its own.
    """

    host: str
    port: int
    scheme: str
    fd: int = -1


def inherited(fd: int, scheme: str) -> Listen:
    """The handed-over listening TCP socket ``fd`` as a :class:`Listen`; EgressError if not one.

    Only a stream socket of AF_INET or AF_INET6 that already listens is taken:
    anything else (a file, a unix socket, a socket not yet listening, a closed
    descriptor) is refused by name, so a mistake never serves on the wrong thing.
    """
    sock = handed_over(fd, f"--{_FD_FLAG[scheme]}", (socket.AF_INET, socket.AF_INET6),
                       "TCP socket", EgressError)
    try:
        host, port = sock.getsockname()[:2]
    finally:
        sock.detach()  # still the caller's: bind() takes it
    return Listen(host, port, scheme, fd)


_FD_FLAG = {"http": "listen-fd", "socks5": "socks-fd"}


def bind(listen: Listen) -> socket.socket:
    """A listening non-blocking socket; EgressError when it cannot be bound.

    A handed-over socket (``listen.fd``) is taken as it is: it listens already,
    and connections made before the proxy started wait in its backlog.
    """
    if listen.fd >= 0:
        sock = socket.socket(fileno=listen.fd)
        sock.setblocking(False)
        return sock
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
        return sock
    except (OSError, IndexError) as exc:
        raise EgressError(f"cannot listen on {listen.host}:{listen.port}: {exc}") from None


def url_of(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def announce_lines(socks: list[tuple[socket.socket, str]]) -> Callable[[], None]:
    """Print ``listening URL`` for each listener, flushed."""
    def announce() -> None:
        for sock, scheme in socks:
            sys.stdout.write(listening_line(url_of(sock, scheme)))
        sys.stdout.flush()
    return announce
