"""The allow list: which host:port the sandbox may reach (pure).

Pattern forms (comma-separated on the command line):

- ``example.com``      that host only, ports 80 and 443;
- ``*.example.com``    its subdomains at any depth, not the bare name;
- ``host:port``        that port only (``[v6]:port`` for IPv6);
- numeric hosts are canonical addresses, so ``127.0.0.1:6443`` matches a
  request for ``2130706433:6443`` too.

Hosts on both sides go through :func:`libegress.hosts.canonical_host`, so case,
a trailing dot and IDN spelling (compared in punycode) never matter.
"""

from __future__ import annotations

from libbroker.named_tuple import NamedTuple
from libegress.hosts import BadHost, canonical_host, parse_port

DEFAULT_PORTS = frozenset({80, 443})


class Pattern(NamedTuple):
    """One allow-list entry: a host (or ``*.`` suffix) and the ports it opens."""

    host: str
    wildcard: bool
    ports: frozenset[int]

    def matches(self, host: str, port: int) -> bool:
        """Whether canonical ``host`` on ``port`` is allowed by this entry."""
        if port not in self.ports:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def parse_pattern(text: str) -> Pattern:
    """One pattern; raises BadHost (a UsageError for the CLI) when malformed."""
    raw = text.strip()
    ports = DEFAULT_PORTS
    host_text = raw
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise BadHost(f"invalid allow pattern {text!r}")
        host_text, rest = raw[: end + 1], raw[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise BadHost(f"invalid allow pattern {text!r}")
            ports = frozenset({parse_port(rest[1:], text)})
    elif raw.count(":") == 1:
        host_text, port_text = raw.split(":")
        ports = frozenset({parse_port(port_text, text)})
    elif ":" in raw:
        host_text = f"[{raw}]"
    wildcard = host_text.startswith("*.")
    if wildcard:
        host_text = host_text[2:]
    if "*" in host_text:
        raise BadHost(f"a wildcard may only lead a pattern: {text!r}")
    host = canonical_host(host_text)
    if (wildcard and ":" in host) or (wildcard and host.replace(".", "").isdigit()):
        raise BadHost(f"a wildcard cannot lead an address: {text!r}")
    return Pattern(host, wildcard, ports)


def parse_patterns(text: str) -> tuple[Pattern, ...]:
    """A comma-separated list of patterns; empty items are skipped."""
    return tuple(parse_pattern(item) for item in text.split(",") if item.strip())


def allowed(patterns: tuple[Pattern, ...], host: str, port: int) -> bool:
    """Whether canonical ``host``:``port`` matches any pattern."""
    return any(p.matches(host, port) for p in patterns)
