"""``agent-sandbox report --propose``: the config's whole ``domains = [...]`` line (pure).

The line is pasted over the config's own, so it is the complete list: the
session's configured domains first, as they were (the start event keeps
them), then each host the allow list refused (or, in learn mode, would have
refused) that none of them covers.  Never proposed: the token's hosts
(allowed anyway), loopback names and addresses (the address rules refuse
them whatever the list says), and a name that is no host pattern (the record's
hosts come from inside the sandbox).  ``*.parent`` replaces three or more
new siblings; a port other than 80 and 443 stays on its own entry.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_PORTS = frozenset({80, 443})
REFUSED_MARK = "not on the allow list"  # egress-proxy's reason (and learn mark) for this
_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_V6 = re.compile(r"\[[0-9a-f:.]+\]")
SIBLINGS = 3


def _split(pattern: str) -> tuple[str, frozenset[int]]:
    """A configured pattern's host part and the ports it opens (an empty set if unreadable)."""
    host, ports = pattern, DEFAULT_PORTS
    if pattern.startswith("["):
        end = pattern.find("]")
        host, rest = pattern[: end + 1], pattern[end + 1 :]
        if rest:
            ports = frozenset({int(rest[1:])}) if rest[1:].isdigit() else frozenset()
    elif pattern.count(":") == 1:
        host, port = pattern.split(":")
        ports = frozenset({int(port)}) if port.isdigit() else frozenset()
    return host.lower().rstrip("."), ports


def covered(patterns: Iterable[str], host: str, port: int) -> bool:
    """Whether a configured pattern already lets ``host``:``port`` through."""
    for pattern in patterns:
        name, ports = _split(pattern)
        if port not in ports:
            continue
        if name == host or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


def loopback(host: str) -> bool:
    """``localhost`` (and below it) or a loopback or unspecified address literal."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def _is_address(host: str) -> bool:
    return host.startswith("[") or host.replace(".", "").isdigit()


def refused_hosts(events: Iterable[Mapping[str, Any]]) -> set[tuple[str, int]]:
    """(host, port) of each egress event the allow list refused or would have refused."""
    found: set[tuple[str, int]] = set()
    for e in events:
        if e.get("ev") != "egress":
            continue
        refused = e.get("verdict") == "refused" and REFUSED_MARK in str(e.get("reason", ""))
        if not (refused or e.get("learn")):
            continue
        host, port = str(e.get("host", "")).lower(), e.get("port")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            found.add((host, port))
    return found


def _new_entries(hosts: set[tuple[str, int]], configured: tuple[str, ...],
                 inject: set[str]) -> list[str]:
    names: set[str] = set()
    ported: set[str] = set()
    for host, port in hosts:
        if not (_NAME.fullmatch(host) or _V6.fullmatch(host)):
            continue  # an escaped control byte, a space: text from the sandbox, no host
        if host in inject or loopback(host) or covered(configured, host, port):
            continue
        if port in DEFAULT_PORTS:
            names.add(host)
        else:
            ported.add(f"{host}:{port}")
    by_parent: dict[str, set[str]] = {}
    for name in names:
        _, dot, parent = name.partition(".")
        if dot and "." in parent and not _is_address(name):
            by_parent.setdefault(parent, set()).add(name)
    entries = set(names)
    for parent, children in by_parent.items():
        if len(children) >= SIBLINGS:
            entries -= children
            entries.add("*." + parent)
    entries |= ported
    return sorted(entries, key=lambda n: (n.removeprefix("*.").split(".")[::-1], n))


def propose(events: Iterable[Mapping[str, Any]], configured: Iterable[str] = (),
            inject: Iterable[str] = ()) -> str:
    """The ``domains = [...]`` line: ``configured`` (duplicates dropped) and what was refused."""
    kept = tuple(dict.fromkeys(str(d) for d in configured))
    new = _new_entries(refused_hosts(events), kept, set(inject))
    return "domains = [" + ", ".join(json.dumps(n) for n in (*kept, *new)) + "]"
