"""How a request gets where :func:`libegress.route.route` let it go (I/O).

Resolve once, check every address against the address rules, and connect to
a checked address only, so what was checked is what is dialled (no second
lookup a rebinding resolver could answer differently).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from libegress.addresses import IPAddress, refusal
from libegress.hosts import ip_of
from libegress.route import BLOCKED_ADDRESS, EgressPolicy, Refused


class UpstreamFailed(Exception):
    """The upstream could not be reached: ``status`` 502 or 504."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
