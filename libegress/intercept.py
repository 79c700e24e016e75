"""The inject hosts' path: TLS terminated, the token set, TLS re-originated.

Reached after a CONNECT (or SOCKS connect) to an inject host on 443.  The
client gets a leaf from the proxy's name-constrained CA; each request inside is
held to the CONNECT host (its Host and any absolute target must name it), loses
the client's Authorization and Proxy-* fields (and, for a ``--secrets`` host,
the client's own value of that secret's header), and gets the proxy's: the
GitHub token's Authorization, or the secret's header.  A held login's secret
(``login`` set) replaces only a placeholder: a request whose field does not
hold one (a Console key in ``x-api-key``, a bearer of its own) goes as it came,
with nothing added.  A held login's token
host is served by :mod:`libegress.login_host` instead (never the GitHub token).
The upstream is dialled under the address rules and its certificate verified.
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
from libegress.heads import authorization, forward_headers, host_header, same_host
from libegress.http1 import ClientSide, Exchanged, HttpError, UpstreamSide, exchange, keep_alive
from libegress.outcome import Mode, Outcome, Verdict
from libegress.route import Refused
from libegress.streams import SocketStream, TlsStream

if TYPE_CHECKING:
    from libegress.login_host import HeldLogin
    from libegress.scope_guard import Dialer

# What only --repos (scope_guard: the scope's rules, urllib.parse, json) or a
# held login (login_host, token_endpoint, placeholders) needs loads with its
# first use below: the token's path alone does without.

HOST_MISMATCH = "host-mismatch"


def inner_target(request: h11.Request, host: str, port: int) -> bytes:
    """The origin-form target of a request inside the tunnel; refuses another host."""
    value = host_header(list(request.headers))
    if value is None or not same_host(value, host, port):
        raise HttpError(421, f"the request's Host is not {host}", HOST_MISMATCH)
    target = request.target
    if target.startswith(b"/"):
        return target
    from urllib.parse import urlsplit  # an absolute target: rare inside a tunnel

    try:
        url = urlsplit(target.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "bad request target") from None
    if url.scheme != "https" or not same_host(url.netloc.encode(), host, port):
        raise HttpError(421, f"the request's target is not on {host}", HOST_MISMATCH)
    path = url.path or "/"
    return (path + ("?" + url.query if url.query else "")).encode("ascii")


def upstream_request(request: h11.Request, target: bytes,
                     credential: tuple[bytes, bytes] | None,
                     drop: bytes = b"authorization", own: bool = False) -> h11.Request:
    """The request as it goes upstream: the client's credentials replaced.

    ``drop`` (lower case) is the credential's field name; the client's values
    of it go, as do Authorization and Proxy-*, whether or not ``credential``
    (the proxy's field) is held yet.  ``own``: the request goes with the
    credentials it brought (Proxy-* gone) and nothing added.
    """
    if own:
        return h11.Request(method=request.method, target=target,
                           headers=forward_headers(list(request.headers), drop_auth=False))
    headers = forward_headers(list(request.headers), drop_auth=True)
    if drop != b"authorization":
        headers = [(n, v) for n, v in headers if n.lower() != drop]
    if credential is not None:
        headers.append(credential)
    return h11.Request(method=request.method, target=target, headers=headers)


def credential_for(services: Services, host: str) -> tuple[bytes, bytes] | None:
    """The field the proxy sets for ``host`` now: its secret's, else the token's."""
    secret = services.secrets.get(host)
    if secret is not None:
        return secret.field()
    token = services.tokens.current()
    return None if token is None else (b"Authorization", authorization(host, token))


async def serve_intercepted(services: Services, raw: SocketStream, early: bytes, host: str,
                            port: int, peer: Peer) -> None:
    """Serve the TLS-terminated connection of an inject host until it ends."""
    limits = services.limits
    try:
        ctx = services.leaves.context_for(host)
        tls = await asyncio.wait_for(TlsStream.server(raw, ctx, early), limits.head_timeout)
    except (ssl.SSLError, OSError, TimeoutError) as exc:
        services.log.report(Outcome(Verdict.FAILED, host, port,
                                    f"client TLS handshake: {_why(exc)}"), peer.pid())
        return
    inject = _Injected(services, ClientSide(tls, limits), host, port, peer)
    try:
        await keep_alive(inject.client, inject)
    except (OSError, ssl.SSLError, h11.LocalProtocolError) as exc:
        services.log.report(Outcome(Verdict.FAILED, host, port, _why(exc)), peer.pid())
    finally:
        await inject.drop_upstream()
        with contextlib.suppress(OSError, ssl.SSLError):
            await asyncio.wait_for(tls.shutdown(), 1.0)


class _Injected:
    """The requests inside one inject host's tunnel: held to the host, credential set."""

    def __init__(self, services: Services, client: ClientSide, host: str, port: int,
                 peer: Peer) -> None:
        self.services = services
        self.client = client
        self.host, self.port = host, port
        self.peer = peer
        self.upstream: UpstreamSide | None = None
        secret = services.secrets.get(host)
        self.drop = secret.lower_name if secret is not None else b"authorization"
        # a login's secret: set in place of the placeholder only
        self.held = secret is not None and bool(secret.secret.login)
        self.login: HeldLogin | None = None
        if any(k.secret.login for k in services.secrets.values()):
            from libegress.login_host import held_login

            self.login = held_login(services, host)

    async def serve(self, request: h11.Request) -> bool:
        services, host, port = self.services, self.host, self.port
        if request.method == b"CONNECT":
            raise HttpError(405, "CONNECT inside a tunnel is refused")
        target = inner_target(request, host, port)
        if self.login is not None:  # a held login's token host: never the GitHub token
            from libegress.login_host import serve_login

            await serve_login(services, self.login, self.client, request, target,
                              self._upstream,
                              lambda credential, own: upstream_request(
                                  request, target, credential, self.drop, own))
            return True
        side, scope = self.client, services.scope
        scoped = scope is not None and scope.applies(host)
        if scope is not None and scoped:
            from libegress.scope_guard import admit

            side = await admit(scope, self.client, request, target, host, port,
                               _dialer(services))
        if self.upstream is None:
            self.upstream = await _open_upstream(services, host, port)
        own = False
        if self.held:  # a login's secret: the request's own credential goes as it came
            from libegress.token_endpoint import carries_placeholder

            own = not carries_placeholder(list(request.headers), self.drop)
        outgoing = upstream_request(
            request, target, None if own else credential_for(services, host), self.drop, own)
        if scoped:  # a body --repos read whole goes with its Content-Length
            from libegress.scope_guard import framed

            outgoing = framed(side, outgoing)
        moved, started = Exchanged(), time.monotonic()
        try:
            await exchange(side, self.upstream, outgoing, moved, trailers=False)
        finally:  # --record: method, path (no query), status, bytes; never a header
            services.record.request(Mode.INTERCEPT, host, port, request.method, target,
                                    moved, started)
        return True

    async def _upstream(self) -> UpstreamSide:
        if self.upstream is None:
            self.upstream = await _open_upstream(self.services, self.host, self.port)
        return self.upstream

    async def refuse(self, error: HttpError) -> None:
        self.services.log.report(Outcome.answered(error.status, str(error), self.host,
                                                  self.port, self.client.method),
                                 self.peer.pid())
        await self.client.refuse(error)

    async def cycle_done(self) -> None:
        if self.upstream is not None and not self.upstream.reusable():
            await self.drop_upstream()

    async def drop_upstream(self) -> None:
        if self.upstream is not None:
            upstream, self.upstream = self.upstream, None
            await _close(upstream)


def _dialer(services: Services) -> Dialer:
    """How --repos's lookups reach a token host: this path's dial, TLS and token."""
    from libegress.scope_guard import Dialer

    return Dialer(lambda host, port: _open_upstream(services, host, port), _close,
                  services.tokens.current)


async def _open_upstream(services: Services, host: str, port: int) -> UpstreamSide:
    limits = services.limits
    try:
        sock = await dial(services.policy, host, port, limits.connect_timeout)
    except Refused as exc:
        raise HttpError(403, str(exc), exc.kind) from None
    except UpstreamFailed as exc:
        raise HttpError(exc.status, str(exc)) from None
    try:
        raw = SocketStream(sock)
        stream = await asyncio.wait_for(
            TlsStream.client(raw, services.upstream_tls, host), limits.connect_timeout
        )
    except TimeoutError:
        sock.close()
        raise HttpError(504, f"TLS with {host} timed out") from None
    except (ssl.SSLError, OSError) as exc:
        # Where it was dialled (the pin's or the resolver's address) says which server
        # answered: a certificate that does not verify is most often the wrong server.
        where = _peer(sock)
        sock.close()
        raise HttpError(502, f"TLS with {host}{where} failed: {_why(exc)}") from None
    return UpstreamSide(stream, limits.response_timeout)


async def _close(upstream: UpstreamSide) -> None:
    with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
        await asyncio.wait_for(upstream.stream.shutdown(), 1.0)
    stream = upstream.stream
    if isinstance(stream, TlsStream):
        stream.raw.sock.close()


def _peer(sock: socket.socket) -> str:
    """" at ADDRESS port N": the server a connected socket reached ("" once it is gone)."""
    try:
        address, port = sock.getpeername()[:2]
    except OSError:
        return ""
    return f" at {address} port {port}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        # the reason alone (CERTIFICATE_VERIFY_FAILED) does not say which check failed
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
