"""The proxy's lifecycle: listeners, the peer check, limits, shutdown.

Each accepted connection is one task owned by :class:`ProxyServer`; on
SIGTERM/SIGINT the listeners close, every connection task is cancelled and
awaited (its sockets closed in ``finally``), the token renewal ends, and
:meth:`run` returns so the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
from collections.abc import Awaitable, Callable

from libegress.context import Peer, Services
from libegress.outcome import Outcome, Verdict
from libegress.peers import is_loopback, peer_socket
from libegress.tokens import keep_all, start_all

Handler = Callable[[Services, socket.socket, Peer], Awaitable[None]]


class ProxyServer:
    """Owns the listeners and every connection task."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._conns: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()

    async def run(self, listeners: list[tuple[socket.socket, Handler]],
                  announce: Callable[[], None]) -> None:
        """Serve until SIGTERM/SIGINT, then end every connection."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        # The first token and secret reads come before serving (waited for at
        # most tokens.FIRST_WAIT), so the first request already carries them; a
        # signal meanwhile still ends the proxy cleanly.
        first = asyncio.create_task(start_all(self.services.keepers()))
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({first, stop}, return_when=asyncio.FIRST_COMPLETED)
        if self._stop.is_set():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            for sock, _ in listeners:
                sock.close()
            return
        keeper = asyncio.create_task(keep_all(self.services.keepers()))
        accepts = [asyncio.create_task(self._accept(s, h)) for s, h in listeners]
        announce()
        try:
            await stop
        finally:
            for task in accepts:
                task.cancel()
            for sock, _ in listeners:
                sock.close()
            keeper.cancel()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(keeper, *accepts, *self._conns, return_exceptions=True)

    async def _accept(self, listener: socket.socket, handler: Handler) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                # EMFILE and friends: say so, breathe, keep serving.
                self.services.log.note(f"accept failed: {exc.strerror or exc}")
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._connection(sock, handler))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _connection(self, sock: socket.socket, handler: Handler) -> None:
        try:
            # A gateway's clients prove who they are with a credential instead.
            peer = self._check_peer(sock) if self.services.gate is None else _any_peer(sock)
            if peer is None:
                return
            if len(self._conns) > self.services.limits.max_connections:
                await self._over_capacity(sock, handler, peer)
                return
            await handler(self.services, sock, peer)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.services.log.report(
                Outcome(Verdict.FAILED, "-", 0, f"internal error: {type(exc).__name__}: {exc}"),
                None)
        finally:
            sock.close()

    def _check_peer(self, sock: socket.socket) -> Peer | None:
        """The peer, if it is a loopback process of this uid; else log and refuse."""
        try:
            peer_host, peer_port = sock.getpeername()[:2]
            our_host, our_port = sock.getsockname()[:2]
        except OSError:
            return None
        peer_ip = ipaddress.ip_address(peer_host.split("%", 1)[0])
        our_ip = ipaddress.ip_address(our_host.split("%", 1)[0])
        peer = Peer(peer_ip, peer_port, finder=self.services.pids)
        if not is_loopback(peer_ip):
            self._refuse(f"peer {peer_ip} is not on loopback", None)
            return None
        found = peer_socket((peer_ip, peer_port), (our_ip, our_port))
        if found is None:
            self._refuse("peer socket not found in the kernel's table", None)
            return None
        peer.inode = found.inode
        if found.uid != os.getuid():
            self._refuse(f"peer owned by uid {found.uid}", peer.pid())
            return None
        return peer

    def _refuse(self, why: str, pid: int | None) -> None:
        """A peer this listener does not serve: logged before any request is read."""
        self.services.log.report(Outcome(Verdict.REFUSED, "-", 0, why), pid)

    async def _over_capacity(self, sock: socket.socket, handler: Handler, peer: Peer) -> None:
        limit = self.services.limits.max_connections
        self.services.log.report(Outcome.answered(503, f"more than {limit} connections", "-", 0),
                                 peer.pid())
        if handler is serve_http:
            import h11

            from libegress.http1 import error_events

            conn = h11.Connection(h11.SERVER)
            data = b"".join(conn.send(e) or b"" for e in
                            error_events(503, "too many connections", None))
            with contextlib.suppress(OSError):
                await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(sock, data), 1.0)


def _any_peer(sock: socket.socket) -> Peer | None:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return None
    return Peer(ipaddress.ip_address(host.split("%", 1)[0]), port)


# The protocol handlers (h11 and the HTTP machinery, SOCKS) load on the first
# connection, not before the proxy says it listens: a session that makes no
# request never pays for them.


async def serve_http(services: Services, sock: socket.socket, peer: Peer) -> None:
    """The HTTP listener's handler (:func:`libegress.http_proxy.serve_http`)."""
    from libegress.http_proxy import serve_http as serve

    await serve(services, sock, peer)


async def serve_socks(services: Services, sock: socket.socket, peer: Peer) -> None:
    """The SOCKS5 listener's handler (:func:`libegress.socks5.serve_socks`)."""
    from libegress.socks5 import serve_socks as serve

    await serve(services, sock, peer)


HANDLERS: dict[str, Handler] = {"http": serve_http, "socks5": serve_socks}
