"""The HTTP proxy listener: CONNECT tunnels and absolute-form plain HTTP.

Per request: the target is parsed and made canonical, :func:`route` decides,
then either a raw tunnel (kernel splice), the inject path (:mod:`intercept`),
or one plain-HTTP exchange through h11 with hop-by-hop fields removed.  Every
refusal is answered (403 + ``X-Proxy-Error``, or the limit's status) and
logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from typing import TYPE_CHECKING

import h11

from libegress.context import Peer, Services
from libegress.dial import UpstreamFailed, dial
from libegress.heads import forward_headers
from libegress.hosts import BadHost, format_authority, parse_authority
from libegress.http1 import ClientSide, Exchanged, HttpError, UpstreamSide, exchange, keep_alive
from libegress.outcome import Mode, Outcome, Verdict
from libegress.route import Refused, Route, route
from libegress.splice import relay
from libegress.streams import SocketStream

if TYPE_CHECKING:
    from libegress.gateway import Tenant

ESTABLISHED = h11.Response(status_code=200, headers=[], reason=b"Connection established")


def connect_target(request: h11.Request) -> tuple[str, int]:
    """The canonical host and port of a CONNECT request (authority form)."""
    try:
        return parse_authority(request.target.decode("ascii"))
    except (BadHost, UnicodeDecodeError) as exc:
        raise HttpError(400, f"bad CONNECT target: {exc}") from None


def absolute_target(request: h11.Request) -> tuple[str, int, bytes]:
    """Host, port and origin-form target of an absolute-form plain-HTTP request."""
    from urllib.parse import urlsplit  # plain HTTP only: a CONNECT does without

    try:
        text = request.target.decode("ascii")
        url = urlsplit(text)
        if url.scheme.lower() != "http" or not url.netloc:
            raise HttpError(400, "a proxy request needs an absolute http:// target")
        host, port = parse_authority(url.netloc, default_port=80)
    except (BadHost, UnicodeDecodeError, ValueError) as exc:
        raise HttpError(400, f"bad request target: {exc}") from None
    path = url.path or "/"
    origin = path + ("?" + url.query if url.query else "")
    return host, port, origin.encode("ascii")


async def _dial(services: Services, host: str, port: int) -> socket.socket:
    try:
        return await dial(services.policy, host, port, services.limits.connect_timeout)
    except Refused as exc:
        raise HttpError(403, str(exc), exc.kind) from None
    except UpstreamFailed as exc:
        raise HttpError(exc.status, str(exc)) from None


async def serve_http(services: Services, sock: socket.socket, peer: Peer) -> None:
    """Serve one client connection of the HTTP listener until it ends."""
    raw = SocketStream(sock)
    plain = _PlainHttp(services, ClientSide(raw, services.limits), raw, peer)
    try:
        await keep_alive(plain.client, plain)
    except (OSError, h11.LocalProtocolError, ssl.SSLError) as exc:
        plain.services.log.report(Outcome(Verdict.FAILED, plain.host, plain.port,
                                          str(exc) or type(exc).__name__), peer.pid())
    finally:
        plain.drop_upstream()


class _PlainHttp:
    """The requests of one HTTP-listener connection: its tenant and its upstream."""

    def __init__(self, services: Services, client: ClientSide, raw: SocketStream,
                 peer: Peer) -> None:
        self.services = services  # the tenant's, once the gateway has admitted one
        self.client = client
        self.raw = raw
        self.peer = peer
        self.upstream: tuple[str, int, UpstreamSide] | None = None
        self.host, self.port = "-", 0
        self.gate = services.gate  # the listener's: a tenant's own services have none
        self.tenant: Tenant | None = None

    async def serve(self, request: h11.Request) -> bool:
        try:
            return await self._serve(request)
        except Refused as exc:
            raise HttpError(403, str(exc), exc.kind) from None

    async def _serve(self, request: h11.Request) -> bool:
        if self.gate is not None:  # every request names its tenant (407 if not)
            self.tenant = self.gate.admit_http(request.headers, self.tenant)
            self.services = self.tenant.services
        services = self.services
        if request.method == b"CONNECT":
            self.host, self.port = connect_target(request)
            await _serve_connect(services, self.client, self.raw, self.host, self.port,
                                 self.peer)
            return False
        host, port, target = absolute_target(request)
        self.host, self.port = host, port
        route(services.policy, host, port, tls=False)
        if self.upstream is None or self.upstream[:2] != (host, port):
            self.drop_upstream()
            self.upstream = (host, port, UpstreamSide(
                SocketStream(await _dial(services, host, port)),
                services.limits.response_timeout))
            services.log.allowed(host, port, Mode.PLAIN, self.peer.pid)
        # RFC 9112 3.2.2: the target URI names the host, not a Host field
        # the client may have set to something else.
        headers = [(n, v) for n, v in forward_headers(list(request.headers), drop_auth=False)
                   if n.lower() != b"host"]
        authority = format_authority(host, port).removesuffix(":80")
        headers.insert(0, (b"Host", authority.encode("ascii")))
        outgoing = h11.Request(method=request.method, target=target, headers=headers)
        moved, started = Exchanged(), time.monotonic()
        try:
            await exchange(self.client, self.upstream[2], outgoing, moved)
        finally:
            services.record.request(Mode.PLAIN, host, port, request.method, target,
                                    moved, started)
        return True

    async def refuse(self, error: HttpError) -> None:
        await _answer(self.services, self.client, error, self.host, self.port, self.peer)

    async def cycle_done(self) -> None:
        if self.upstream is not None and not self.upstream[2].reusable():
            self.drop_upstream()

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            _close(self.upstream[2])
            self.upstream = None


async def _answer(services: Services, client: ClientSide, exc: HttpError, host: str,
                  port: int, peer: Peer) -> None:
    services.log.report(Outcome.answered(exc.status, str(exc), host, port, client.method),
                        peer.pid())
    await client.refuse(exc)


async def _serve_connect(services: Services, client: ClientSide, raw: SocketStream, host: str,
                         port: int, peer: Peer) -> None:
    how = route(services.policy, host, port, tls=True)
    if how is Route.INTERCEPT:
        # The inject path (TLS, the credential, --repos, the logins) loads with
        # its first use: a session whose requests are all tunnels never pays it.
        from libegress.intercept import serve_intercepted

        services.log.allowed(host, port, Mode.INTERCEPT, peer.pid)
        await client.send(ESTABLISHED)
        await serve_intercepted(services, raw, client.switched_data(), host, port, peer)
        return
    started = time.monotonic()
    upstream = await _dial(services, host, port)
    services.log.allowed(host, port, Mode.TUNNEL, peer.pid)
    moved = (0, 0)
    try:
        await client.send(ESTABLISHED)
        early = client.switched_data()
        if early:
            await asyncio.get_running_loop().sock_sendall(upstream, early)
        moved = await relay(raw.sock, upstream)
        moved = (moved[0] + len(early), moved[1])
    except OSError as exc:
        services.log.report(Outcome(Verdict.FAILED, host, port,
                                    f"tunnel: {exc.strerror or exc}"), peer.pid())
    finally:
        upstream.close()
        services.record.event(Outcome(Verdict.ALLOWED, host, port, mode=Mode.TUNNEL),
                              started=started, up=moved[0], down=moved[1])


def _close(upstream: UpstreamSide) -> None:
    stream = upstream.stream
    if isinstance(stream, SocketStream):
        with contextlib.suppress(OSError):
            stream.sock.close()
