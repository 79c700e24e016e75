"""What a server says to the launcher on its stdout: the one codec of those lines.

egress-proxy and broker-server print a ``listening URL`` line per listener
once they serve (``http://…``, ``socks5://…``, ``unix:PATH``), then, with
``--record`` or ``--audit`` on the launcher's pipe, one JSON object per line
per event.  The servers write them and the launcher reads them with these
functions only, so the two sides cannot disagree on the shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LISTENING = "listening"


def listening_line(url: str) -> str:
    """The line a server prints when ``url`` is served."""
    return f"{LISTENING} {url}\n"


def listening_url(line: str) -> str | None:
    """The URL of a ``listening`` line, else None."""
    words = line.split()
    if len(words) != 2 or words[0] != LISTENING:
        return None
    return words[1]


def event_line(entry: Mapping[str, object]) -> str:
    """One event as its line: compact JSON (the caller keeps it under PIPE_BUF)."""
    return json.dumps(entry, separators=(",", ":")) + "\n"


def is_event(line: str) -> bool:
    """Whether ``line`` is an event (a JSON object), not a ``listening`` or other line."""
    return line.startswith("{")


def parse_event(line: str, max_len: int) -> dict[str, Any] | None:
    """The object of an event line up to ``max_len`` characters, else None."""
    if not is_event(line) or len(line) > max_len:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
