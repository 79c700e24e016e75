"""Address rules: which resolved addresses the proxy dials (pure).

Only public unicast addresses are dialled.  Every IPv6 form that carries an
IPv4 address inside it (mapped, compatible, NAT64, 6to4, Teredo) is refused
outright rather than unwrapped: the proxy has no business dialling one, and an
unwrapping rule is one more place to get wrong.  ``--allow-cidr`` ranges are
checked first and open exactly the range given.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_BLOCKED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved or broadcast"),
)
_V6_BLOCKED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "IPv4-embedded IPv6 (mapped)"),
    ("::/96", "IPv4-embedded IPv6 (compatible)"),
    ("64:ff9b::/96", "IPv4-embedded IPv6 (NAT64)"),
    ("64:ff9b:1::/48", "IPv4-embedded IPv6 (local NAT64)"),
    ("100::/64", "discard"),
    ("2001::/32", "IPv4-embedded IPv6 (Teredo)"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "IPv4-embedded IPv6 (6to4)"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_BLOCKED: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in _V4_BLOCKED + _V6_BLOCKED
)


def parse_cidr(text: str) -> Network:
    """An ``--allow-cidr`` value; ValueError when it is not a network."""
    return ipaddress.ip_network(text.strip(), strict=False)


def refusal(address: IPAddress, allow: Iterable[Network] = ()) -> str | None:
    """Why ``address`` may not be dialled, or None when it may."""
    for net in allow:
        if address.version == net.version and address in net:
            return None
    for net, why in _BLOCKED:
        if address.version == net.version and address in net:
            return f"{address} is {why}"
    return None
