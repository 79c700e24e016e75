"""Where a request may go, and how it gets there.

:func:`route` is pure: allow list and inject hosts decide whether a host:port
is tunnelled, intercepted (TLS terminated, token set) or refused.  :func:`dial`
is the thin I/O after it: resolve once, check every address against the
address rules, and connect to a checked address only, so what was checked is
what is dialled (no second lookup a rebinding resolver could answer
differently).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
from dataclasses import dataclass, field

from libegress.addresses import IPAddress, Network, refusal
from libegress.allowlist import Pattern, allowed
from libegress.hosts import format_authority, ip_of

BLOCKED_ALLOWLIST = "blocked-by-allowlist"
BLOCKED_ADDRESS = "blocked-address"


class Refused(Exception):
    """A request policy refuses: 403 with ``kind`` as X-Proxy-Error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class UpstreamFailed(Exception):
    """The upstream could not be reached: ``status`` 502 or 504."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Route(enum.Enum):
    """What the proxy does with an allowed destination."""

    PASS = "pass"  # noqa: S105 - not a password: a raw tunnel, or plain HTTP forwarded as is
    INTERCEPT = "intercept"  # TLS terminated, token set
    LEARN = "learn"  # --learn: not on the allow list, passed as PASS is (and recorded)


@dataclass(frozen=True)
class Pin:
    """A ``--resolve`` entry: trusted, so the address rules do not apply."""

    address: IPAddress
    port: int | None = None


@dataclass(frozen=True)
class EgressPolicy:
    """The proxy's whole policy, fixed at start."""

    allow: tuple[Pattern, ...] = ()
    inject: tuple[str, ...] = ("github.com", "api.github.com")
    pins: dict[str, Pin] = field(default_factory=dict)
    allow_cidrs: tuple[Network, ...] = ()
    learn: bool = False  # --learn: any host and port the inject rules leave is passed


def route(policy: EgressPolicy, host: str, port: int, *, tls: bool) -> Route:
    """How canonical ``host``:``port`` is served; raises Refused.

    ``tls`` is True for CONNECT and SOCKS (the client may speak TLS inside) and
    False for absolute-form plain HTTP, which an inject host never gets.
    """
    where = format_authority(host, port)
    if host in policy.inject:
        if not tls:
            raise Refused(BLOCKED_ALLOWLIST, f"plain HTTP to {host} is refused; use https")
        if port != 443:
            raise Refused(BLOCKED_ALLOWLIST, f"{where} is refused: {host} is served on 443 only")
        return Route.INTERCEPT
    if allowed(policy.allow, host, port):
        return Route.PASS
    if policy.learn:  # after the inject rules, before the address rules (which still hold)
        return Route.LEARN
    raise Refused(BLOCKED_ALLOWLIST, f"{where} is not on the allow list")


async def resolve(policy: EgressPolicy, host: str, port: int,
                  timeout: float = 10.0) -> list[tuple[IPAddress, int]]:
    """The checked addresses to dial for ``host``:``port``; raises Refused."""
    pin = policy.pins.get(host)
    if pin is not None:
        return [(pin.address, pin.port or port)]
    literal = ip_of(host)
    if literal is not None:
        candidates: list[IPAddress] = [literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
        except TimeoutError:
            raise UpstreamFailed(504, f"resolving {host} timed out") from None
        except (socket.gaierror, UnicodeError) as exc:
            raise UpstreamFailed(502, f"{host} does not resolve: {exc}") from None
        candidates = []
        for info in infos:
            address = ip_of(str(info[4][0]).split("%", 1)[0])
            if address is not None and address not in candidates:
                candidates.append(address)
    ok = [a for a in candidates if refusal(a, policy.allow_cidrs) is None]
    if not ok:
        why = refusal(candidates[0], policy.allow_cidrs) if candidates else "no address"
        raise Refused(BLOCKED_ADDRESS, f"{host} is refused: {why}")
    return [(a, port) for a in ok]


async def connect(addresses: list[tuple[IPAddress, int]], timeout: float) -> socket.socket:
    """A connected non-blocking socket to the first address that answers."""
    loop = asyncio.get_running_loop()
    last: Exception | None = None
    deadline = loop.time() + timeout
    for address, port in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            remaining = max(deadline - loop.time(), 0.01)
            await asyncio.wait_for(loop.sock_connect(sock, (str(address), port)), remaining)
            return sock
        except TimeoutError:
            sock.close()
            raise UpstreamFailed(504, f"connecting to {address} port {port} timed out") from None
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            with contextlib.suppress(OSError):
                sock.close()
            raise
    reason = last.strerror if isinstance(last, OSError) and last.strerror else str(last)
    raise UpstreamFailed(502, f"cannot connect: {reason}")


async def dial(policy: EgressPolicy, host: str, port: int, timeout: float) -> socket.socket:
    """Resolve once, check, and connect to a checked address."""
    return await connect(await resolve(policy, host, port, timeout), timeout)
