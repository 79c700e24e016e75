"""The one line a session ends with when something was refused (pure).

Refusals go to the log (a file, when an agent owns the terminal) and to the
session record; without this line a person at the terminal would not know
to look.  :class:`Refusals` counts the record's events as the launcher
writes them; :meth:`Refusals.line` is what it prints on stderr at the end,
or None when nothing was refused.  Host names come from inside the sandbox:
each is escaped of unprintable characters and cut, and only a few are named.
"""

from __future__ import annotations

from collections.abc import Mapping

HOSTS_SHOWN = 3
NAME_MAX = 60
_DEFAULT_PORTS = (80, 443)


def shown(host: object, port: object) -> str:
    """A host as the line names it: printable, at most NAME_MAX characters, its odd port."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(host))
    if len(text) > NAME_MAX:
        text = text[: NAME_MAX - 3] + "..."
    if isinstance(port, int) and not isinstance(port, bool) and port not in _DEFAULT_PORTS:
        text += f":{port}"
    return text


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class Refusals:
    """What the servers refused in one session, counted from its record's events."""

    def __init__(self) -> None:
        self.requests = 0
        self.hosts: dict[str, None] = {}  # first seen first; a dict keeps that order
        self.commands = 0
        self.signatures = 0
        self.learned: dict[str, None] = {}  # learn mode: hosts the allow list would refuse

    def add(self, ev: str, fields: Mapping[str, object]) -> None:
        """One event as the record gets it (``ev`` and its fields)."""
        if ev == "egress":
            host, port = fields.get("host"), fields.get("port")
            if fields.get("verdict") == "refused":
                self.requests += 1
                if host not in (None, "", "-"):
                    self.hosts.setdefault(shown(host, port))
            elif fields.get("learn") and host not in (None, "", "-"):
                self.learned.setdefault(shown(host, port))
        elif ev == "broker" and "refused" in fields:
            self.commands += 1
        elif ev == "sign" and "refused" in fields:
            self.signatures += 1

    def line(self, session_id: str) -> str | None:
        """``agent-sandbox: 3 requests refused (a.org, b.org): agent-sandbox report ID``."""
        parts = []
        if self.requests:
            parts.append(_count(self.requests, "request") + " refused" + _names(self.hosts))
        if self.commands:
            parts.append(_count(self.commands, "brokered command") + " refused")
        if self.signatures:
            parts.append(_count(self.signatures, "signature") + " refused")
        if parts:
            return f"agent-sandbox: {'; '.join(parts)}: agent-sandbox report {session_id}"
        if self.learned:
            return (f"agent-sandbox: learn mode: the allow list would have refused "
                    f"{_count(len(self.learned), 'host')}{_names(self.learned)}: "
                    f"agent-sandbox report --propose {session_id}")
        return None


def _names(hosts: Mapping[str, None]) -> str:
    if not hosts:
        return ""
    names = list(hosts)
    more = len(names) - HOSTS_SHOWN
    return f" ({', '.join(names[:HOSTS_SHOWN])}{f', {more} more' if more > 0 else ''})"
