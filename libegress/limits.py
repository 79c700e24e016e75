"""Bounds on what one client may make the proxy hold or wait for.

Apart from :mod:`libegress.http1` so the proxy's start-up (options, shared
services) does not import h11: the HTTP machinery loads on the first
connection.

A NamedTuple, not a dataclass: egress-proxy makes it before its ``listening``
line, where the dataclasses module (and the inspect module it loads) and a
dataclass's generated methods cost the proxy ~10 ms of CPU
(tests/test_import_budget.py holds that path free of them).
"""

from __future__ import annotations

from libbroker.named_tuple import NamedTuple


class Limits(NamedTuple):
    """Bounds on what one client may make the proxy hold or wait for."""

    max_head: int = 32 * 1024  # request head bytes (431)
    max_request_line: int = 8 * 1024  # (431)
    idle_timeout: float = 120.0  # no request on a kept-alive connection (408)
    head_timeout: float = 30.0  # a request head or TLS handshake in progress (408)
    connect_timeout: float = 10.0  # resolving and connecting upstream (504)
    response_timeout: float = 300.0  # no byte of the upstream's response (504)
    max_connections: int = 1024  # client connections at once (503)
