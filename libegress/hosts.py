"""Host names and authorities as the proxy compares them (pure).

Every host the sandbox names passes through :func:`canonical_host` before any
rule looks at it, so one spelling of a host is compared everywhere:

- letters are lowered, one trailing dot is dropped, IDN labels become punycode;
- anything a resolver would read as an IPv4 address (``2130706433``,
  ``0x7f.1``, ``0177.0.0.1``, ``127.1``) *is* that address, written dotted-quad,
  so an allow-list entry or an address rule cannot be walked around by spelling;
- IPv6 literals (bracketed or not) become their compressed form; zone ids and
  anything else a host name cannot hold are refused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded where an address is made: the launcher's config check makes none
    import ipaddress


class BadHost(ValueError):
    """A host or authority is not a usable host name (a refusal, not a crash)."""


_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
# A label a resolver (inet_aton) reads as a number: decimal, 0-octal or 0x-hex.
# "0x" alone is no number to inet_aton (glibc refuses it), so a hex label needs a digit.
_NUMERIC_LABEL = re.compile(r"^(?:0[xX][0-9a-fA-F]+|[0-9]+)$")
_MAX_HOST = 253


def parse_ipv4_loose(text: str) -> ipaddress.IPv4Address | None:
    """The address inet_aton would read in ``text``, or None if it is no number.

    Raises BadHost for text that is numeric but out of range (``256.1.1.1``), since a
    resolver would refuse it too and a name it is not.
    """
    number = _ipv4_number(text)
    if number is None:
        return None
    import ipaddress

    return ipaddress.IPv4Address(number)


def _ipv4_number(text: str) -> int | None:
    """:func:`parse_ipv4_loose`'s address as a number (BadHost out of range)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_LABEL.match(p) for p in parts):
        return None
    values: list[int] = []
    for part in parts:
        if part[:2].lower() == "0x":
            values.append(int(part[2:], 16))
        elif len(part) > 1 and part.startswith("0"):
            if not all(c in "01234567" for c in part):
                raise BadHost(f"invalid numeric host {text!r}")
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *front, last = values
    if any(v > 255 for v in front) or last >= 1 << (8 * (4 - len(front))):
        raise BadHost(f"numeric host out of range {text!r}")
    number = 0
    for v in front:
        number = (number << 8) | v
    return (number << (8 * (4 - len(front)))) | last


def canonical_host(raw: str) -> str:
    """The one spelling of host ``raw`` every rule compares (see module doc)."""
    host = raw.strip()
    if host.startswith("[") and host.endswith("]"):
        return _ipv6(host[1:-1], raw)
    if ":" in host:
        return _ipv6(host, raw)
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > _MAX_HOST:
        raise BadHost(f"invalid host {raw!r}")
    v4 = _ipv4_number(host)
    if v4 is not None:  # dotted-quad, as str(IPv4Address) writes it
        return ".".join(str((v4 >> shift) & 0xFF) for shift in (24, 16, 8, 0))
    if host.isascii():
        # The idna codec's own answer for an ASCII name is the name (its label
        # lengths, which it checks, are checked below), and loading the codec
        # (~1 ms of CPU with stringprep) is then for nothing.
        ascii_host = host.lower()
    else:
        try:
            ascii_host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise BadHost(f"invalid host {raw!r}") from None
    labels = ascii_host.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise BadHost(f"invalid host {raw!r}")
    if _NUMERIC_LABEL.match(labels[-1]):
        # A resolver would try this as an address and fail; a name it is not.
        raise BadHost(f"invalid host {raw!r}")
    return ascii_host


def _ipv6(text: str, raw: str) -> str:
    if "%" in text:
        raise BadHost(f"IPv6 zone ids are refused: {raw!r}")
    import ipaddress

    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise BadHost(f"invalid host {raw!r}") from None


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a canonical host is, or None for a name."""
    import ipaddress

    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def parse_authority(raw: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as (canonical host, port).

    Userinfo, empty and out-of-range ports are refused; without a port the
    ``default_port`` is used, or the authority is refused when there is none.
    """
    text = raw.strip()
    if "@" in text or not text or any(c in text for c in "/?#\\ \t"):
        raise BadHost(f"invalid authority {raw!r}")
    port_text: str | None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise BadHost(f"invalid authority {raw!r}")
        host_text, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise BadHost(f"invalid authority {raw!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host_text, port_text = text.split(":")
    elif ":" in text:
        raise BadHost(f"IPv6 addresses must be bracketed: {raw!r}")
    else:
        host_text, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise BadHost(f"authority without a port {raw!r}")
        port = default_port
    else:
        port = parse_port(port_text, raw)
    return canonical_host(host_text), port


def parse_port(text: str, context: str) -> int:
    """A TCP port 1..65535 in decimal digits only."""
    if not text.isdigit() or len(text) > 5 or not 0 < int(text) < 65536:
        raise BadHost(f"invalid port in {context!r}")
    return int(text)


def format_authority(host: str, port: int) -> str:
    """``host:port``, bracketing an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
