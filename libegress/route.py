"""Where a request may go (pure): the proxy's policy and its routing decision.

:func:`route` decides from the allow list and inject hosts whether a
host:port is tunnelled, intercepted (TLS terminated, token set) or refused.
How it then gets there is :mod:`libegress.dial`'s (resolve once, check every
address, connect to a checked one).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from types import MappingProxyType

from libbroker.named_tuple import NamedTuple
from libegress.addresses import IPAddress, Network
from libegress.allowlist import Pattern, allowed
from libegress.hosts import BadHost, canonical_host, format_authority, parse_authority

BLOCKED_ALLOWLIST = "blocked-by-allowlist"
BLOCKED_ADDRESS = "blocked-address"


class Refused(Exception):
    """A request policy refuses: 403 with ``kind`` as X-Proxy-Error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Route(enum.Enum):
    """What the proxy does with an allowed destination."""

    PASS = "pass"  # noqa: S105 - not a password: a raw tunnel, or plain HTTP forwarded as is
    INTERCEPT = "intercept"  # TLS terminated, token set
    LEARN = "learn"  # --learn: not on the allow list, passed as PASS is (and recorded)


class Pin(NamedTuple):
    """A ``--resolve`` entry: trusted, so the address rules do not apply."""

    address: IPAddress
    port: int | None = None


def parse_pin(text: str) -> tuple[str, Pin]:
    """``HOST:IP``, ``HOST:IP:PORT`` or ``HOST:[IPv6]:PORT`` (the port redirects).

    ValueError (BadHost is one) when ``text`` is none of these; egress-proxy's
    ``--resolve`` and agent-sandbox's ``resolve`` key both come through here.
    """
    host_text, sep, rest = text.partition(":")
    if not sep or not rest:
        raise BadHost("must be HOST:IP or HOST:IP:PORT")
    host = canonical_host(host_text)
    try:
        return host, Pin(ipaddress.ip_address(rest.strip("[]")))
    except ValueError:
        address, port = parse_authority(rest)
        return host, Pin(ipaddress.ip_address(address), port)


class EgressPolicy(NamedTuple):
    """The proxy's whole policy, fixed at start."""

    allow: tuple[Pattern, ...] = ()
    inject: tuple[str, ...] = ("github.com", "api.github.com")
    pins: Mapping[str, Pin] = MappingProxyType({})  # read-only: this default is shared
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
