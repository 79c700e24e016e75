"""The SOCKS5 listener (RFC 1928): CONNECT only; no authentication, or RFC 1929's in gateway mode.

The wire format is parsed by the pure functions below; :func:`serve_socks`
applies the same allow list, address rules and inject-host interception as the
HTTP listener, answering refusals with SOCKS reply codes and a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from libbroker.named_tuple import NamedTuple
from libegress.context import Peer, Services
from libegress.dial import UpstreamFailed, dial
from libegress.hosts import BadHost, canonical_host
from libegress.outcome import Mode, Outcome, Verdict
from libegress.route import Refused, Route, route
from libegress.splice import relay
from libegress.streams import SocketStream

if TYPE_CHECKING:
    from libegress.gateway import Gate

T = TypeVar("T")

VERSION = 5
NO_AUTH = 0
NO_ACCEPTABLE = 0xFF
CMD_CONNECT = 1
ATYP_V4, ATYP_DOMAIN, ATYP_V6 = 1, 3, 4

SUCCEEDED = 0
GENERAL_FAILURE = 1
NOT_ALLOWED = 2
HOST_UNREACHABLE = 4
CONNECTION_REFUSED = 5
TTL_EXPIRED = 6
COMMAND_NOT_SUPPORTED = 7
ADDRESS_NOT_SUPPORTED = 8


class SocksError(Exception):
    """A malformed or unsupported SOCKS message; ``code`` is the reply to send."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectRequest(NamedTuple):
    """A parsed SOCKS5 request: the raw host text, the port, bytes used."""

    host: str
    port: int
    size: int


def parse_greeting(buf: bytes) -> tuple[frozenset[int], int] | None:
    """The offered methods and the greeting's size, or None for more bytes."""
    if len(buf) < 2:
        return None
    if buf[0] != VERSION:
        raise SocksError(None, f"not SOCKS5 (version byte {buf[0]})")
    size = 2 + buf[1]
    if len(buf) < size:
        return None
    return frozenset(buf[2:size]), size


def parse_request(buf: bytes) -> ConnectRequest | None:
    """The CONNECT request in ``buf``, or None for more bytes; raises SocksError."""
    if len(buf) < 4:
        return None
    version, command, _, atyp = buf[:4]
    if version != VERSION:
        raise SocksError(GENERAL_FAILURE, "bad SOCKS request version")
    if command != CMD_CONNECT:
        raise SocksError(COMMAND_NOT_SUPPORTED, f"SOCKS command {command} is not supported")
    if atyp == ATYP_V4:
        end = 8
        host = str(ipaddress.IPv4Address(buf[4:8])) if len(buf) >= end else ""
    elif atyp == ATYP_V6:
        end = 20
        host = f"[{ipaddress.IPv6Address(buf[4:20])}]" if len(buf) >= end else ""
    elif atyp == ATYP_DOMAIN:
        if len(buf) < 5:
            return None
        end = 5 + buf[4]
        host = buf[5:end].decode("utf-8", "replace") if len(buf) >= end else ""
    else:
        raise SocksError(ADDRESS_NOT_SUPPORTED, f"SOCKS address type {atyp} is not supported")
    if len(buf) < end + 2:
        return None
    (port,) = struct.unpack("!H", buf[end : end + 2])
    return ConnectRequest(host, port, end + 2)


def reply(code: int, bound: tuple[str, int] | None = None) -> bytes:
    """A reply with ``code`` and the bound address (0.0.0.0:0 when unknown)."""
    address = ipaddress.ip_address(bound[0]) if bound else ipaddress.IPv4Address(0)
    port = bound[1] if bound else 0
    atyp = ATYP_V4 if address.version == 4 else ATYP_V6
    return bytes([VERSION, code, 0, atyp]) + address.packed + struct.pack("!H", port)


async def _read_until(raw: SocketStream, buf: bytearray,
                      parse: Callable[[bytes], T | None]) -> T:
    """Read into ``buf`` until ``parse`` finds a whole message in it."""
    while True:
        parsed = parse(bytes(buf))
        if parsed is not None:
            return parsed
        if len(buf) > 1024:
            raise SocksError(GENERAL_FAILURE, "SOCKS message too long")
        data = await raw.recv()
        if not data:
            raise SocksError(None, "the client closed during the SOCKS handshake")
        buf += data


async def serve_socks(services: Services, sock: socket.socket, peer: Peer) -> None:
    """Serve one SOCKS5 client connection until it ends."""
    raw = SocketStream(sock)
    limits = services.limits
    buf = bytearray()
    host, port = "-", 0
    try:
        services, request = await _handshake(services, raw, buf)
        early = bytes(buf[request.size :])
        port = request.port
        host = request.host
        try:
            host = canonical_host(request.host)
        except BadHost as exc:
            raise SocksError(HOST_UNREACHABLE, str(exc)) from None
        how = route(services.policy, host, port, tls=True)
        if how is Route.INTERCEPT:
            from libegress.intercept import serve_intercepted  # with its first use

            services.log.allowed(host, port, Mode.INTERCEPT, peer.pid)
            await raw.send(reply(SUCCEEDED))
            await serve_intercepted(services, raw, early, host, port, peer)
            return
        await _tunnel(services, raw, early, (host, port), peer, limits.connect_timeout)
    except Refused as exc:
        services.log.report(Outcome(Verdict.REFUSED, host, port, f"socks {exc.kind}: {exc}"),
                            peer.pid())
        await _send_quietly(raw, reply(NOT_ALLOWED))
    except UpstreamFailed as exc:
        code = TTL_EXPIRED if exc.status == 504 else HOST_UNREACHABLE
        if "refused" in str(exc).lower():
            code = CONNECTION_REFUSED
        services.log.report(Outcome(Verdict.FAILED, host, port, f"socks: {exc}"), peer.pid())
        await _send_quietly(raw, reply(code))
    except SocksError as exc:
        services.log.report(Outcome(Verdict.REFUSED, host, port, f"socks: {exc}"), peer.pid())
        if exc.code is not None:
            await _send_quietly(raw, reply(exc.code))
    except TimeoutError:
        services.log.report(Outcome(Verdict.LIMIT, host, port,
                                    "socks: the handshake was not complete within "
                                    f"{limits.head_timeout:g}s"), peer.pid())
    except OSError as exc:
        services.log.report(Outcome(Verdict.FAILED, host, port, f"socks: {exc.strerror or exc}"),
                            peer.pid())


async def _handshake(services: Services, raw: SocketStream,
                     buf: bytearray) -> tuple[Services, ConnectRequest]:
    """The greeting, the method (the gateway's tenant, if any) and the request.

    One deadline for the whole handshake (greeting and request), from the
    connection's start: a client sending a byte at a time gains nothing.
    """
    async with asyncio.timeout(services.limits.head_timeout):
        methods, used = await _read_until(raw, buf, parse_greeting)
        del buf[:used]
        if services.gate is not None:
            services = await _authenticate(services.gate, raw, buf, methods)
        elif NO_AUTH not in methods:
            await raw.send(bytes([VERSION, NO_ACCEPTABLE]))
            raise SocksError(None, "the client offers no method without authentication")
        else:
            await raw.send(bytes([VERSION, NO_AUTH]))
        return services, await _read_until(raw, buf, parse_request)


async def _tunnel(services: Services, raw: SocketStream, early: bytes, to: tuple[str, int],
                  peer: Peer, connect_timeout: float) -> None:
    """A raw tunnel to ``to``: the SOCKS reply, then both ways by splice."""
    host, port = to
    started = time.monotonic()
    upstream = await dial(services.policy, host, port, connect_timeout)
    services.log.allowed(host, port, Mode.SOCKS, peer.pid)
    moved = (0, 0)
    try:
        await raw.send(reply(SUCCEEDED, upstream.getsockname()[:2]))
        if early:
            await raw.loop.sock_sendall(upstream, early)
        moved = await relay(raw.sock, upstream)
        moved = (moved[0] + len(early), moved[1])
    finally:
        upstream.close()
        services.record.event(Outcome(Verdict.ALLOWED, host, port, mode=Mode.SOCKS),
                              started=started, up=moved[0], down=moved[1])


async def _authenticate(gate: Gate, raw: SocketStream, buf: bytearray,
                        methods: frozenset[int]) -> Services:
    """RFC 1929: the tenant whose user name and password the client sends."""
    from libegress.proxyauth import (  # the gateway's only
        AUTH_FAILED,
        AUTH_OK,
        USERPASS,
        WRONG,
        BadCredentials,
        TenantFull,
        parse_userpass,
    )

    if USERPASS not in methods:
        await raw.send(bytes([VERSION, NO_ACCEPTABLE]))
        raise SocksError(None, "the client offers no username/password authentication")
    await raw.send(bytes([VERSION, USERPASS]))
    try:
        credentials, used = await _read_until(raw, buf, parse_userpass)
        del buf[:used]
        tenant = gate.admit(credentials)
    except BadCredentials as exc:
        await _send_quietly(raw, AUTH_FAILED)
        raise SocksError(None, str(exc)) from None
    if tenant is None:
        await _send_quietly(raw, AUTH_FAILED)
        raise SocksError(None, WRONG)
    await raw.send(AUTH_OK)
    try:
        return gate.enter(tenant)
    except TenantFull as exc:
        raise SocksError(GENERAL_FAILURE, str(exc)) from None


async def _send_quietly(raw: SocketStream, data: bytes) -> None:
    with contextlib.suppress(OSError):
        await raw.send(data)
