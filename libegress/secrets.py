"""The ``--secrets`` file: which header, with which value, goes to which host (pure).

The file is a JSON list with one object per secret::

    [{"host": "api.anthropic.com", "header": "x-api-key", "format": "{}",
      "command": "cat /path/to/key", "every": 300}]

``host``, ``header`` and ``command`` are required; ``format`` defaults to
``"Bearer {}"`` and ``every`` (seconds between renewals) to 300.  ``login``
(``claude``, ``codex`` or ``gemini``) says the value is that agent's OAuth
access token, from :mod:`libegress.login_keeper`: the agent's token host is
then served by :mod:`libegress.token_endpoint` (a refresh from inside answered
with placeholders, a new login kept on the host), with the entry's command.  ``{}`` in
``format`` stands for the command's value, exactly once; a format of the form
``"Basic X{}Y"`` sends ``Basic base64(X VALUE Y)``, as git expects of
``"Basic x-access-token:{}"``.  Every host becomes an inject host, so it must
be a DNS name and appear once (across the file and ``--inject``).  The header
must be a field name the proxy may set: a token (RFC 9110 5.1) other than
``Host``, the framing and hop-by-hop fields and ``Proxy-*``.

Nothing here reads a file or runs a command: :func:`parse_secrets` checks the
text, the shells run the commands.  A refusal is a :class:`UsageError` naming
the entry and the key, never a value.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from libbroker.errors import UsageError
from libegress.hosts import BadHost, canonical_host, ip_of
from libegress.oauth_login import KINDS
from libegress.token_endpoint import ENDPOINTS

DEFAULT_FORMAT = "Bearer {}"
DEFAULT_EVERY = 300.0
PLACEHOLDER = "{}"
KEYS = frozenset({"host", "header", "format", "command", "every", "login"})
REQUIRED = ("host", "header", "command")
# RFC 9110 5.1: a field name is a token.
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
# Fields the proxy must not set: the target, the framing, hop-by-hop fields.
FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te", "trailer", "upgrade", "expect",
})
# Printable ASCII (spaces allowed inside, not at the ends): a value cannot end
# the field or start another.
_FORMAT = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?$")
MAX_SECRETS = 64


@dataclass(frozen=True)
class Secret:
    """One checked entry: ``header`` is the field name as the file spells it."""

    host: str
    header: str
    format: str
    argv: tuple[str, ...]
    every: float = DEFAULT_EVERY
    login: str = ""  # an agent's OAuth login kind (libegress.oauth_login.KINDS), or ""


def header_value(fmt: str, value: str) -> bytes:
    """The field value ``value`` is sent as under format ``fmt``."""
    if fmt.startswith("Basic ") and PLACEHOLDER in fmt:
        inner = fmt[len("Basic "):].replace(PLACEHOLDER, value)
        return b"Basic " + base64.b64encode(inner.encode("ascii"))
    return fmt.replace(PLACEHOLDER, value).encode("ascii")


def parse_secrets(text: str, source: str, inject: tuple[str, ...] = ()) -> tuple[Secret, ...]:
    """The secrets in JSON ``text`` (read from ``source``); UsageError when wrong.

    ``inject`` are the ``--inject`` hosts: a secret may not name one of them.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--secrets {source}: not valid JSON: {_first_line(exc)}") from None
    if not isinstance(data, list):
        raise UsageError(f"--secrets {source}: must be a JSON list of objects")
    if len(data) > MAX_SECRETS:
        raise UsageError(f"--secrets {source}: more than {MAX_SECRETS} secrets")
    seen = set(inject)
    out: list[Secret] = []
    for index, entry in enumerate(data):
        secret = parse_entry(entry, f"--secrets {source}: entry {index}")
        if secret.host in seen:
            also = " (an --inject host)" if secret.host in inject else ""
            raise UsageError(f"--secrets {source}: entry {index}: duplicate host "
                             f"{secret.host}{also}")
        seen.add(secret.host)
        out.append(secret)
    return tuple(out)


def parse_entry(entry: Any, where: str) -> Secret:
    """One entry of the list, checked; UsageError starting with ``where``.

    agent-sandbox's config check calls this on each ``[[secret]]`` too, so a
    session never hands egress-proxy an entry it would refuse at start.
    """
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be a JSON object")
    unknown = sorted(str(k) for k in entry if k not in KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}")
    for key in REQUIRED:
        if key not in entry:
            raise UsageError(f"{where}: missing key {key!r}")
    return Secret(
        host=_host(entry["host"], where),
        header=_header(entry["header"], where),
        format=_format(entry.get("format", DEFAULT_FORMAT), where),
        argv=_argv(entry["command"], where),
        every=_every(entry.get("every", DEFAULT_EVERY), where),
        login=_login(entry.get("login", ""), where),
    )


def _host(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{where}: 'host' must be a string")
    try:
        host = canonical_host(value)
    except BadHost:
        raise UsageError(f"{where}: 'host' is not a valid host name: {value!r}") from None
    if ip_of(host) is not None:
        raise UsageError(f"{where}: 'host' must be a DNS name, not an address: {value!r}")
    return host


def _header(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _TOKEN.match(value):
        shown = value if isinstance(value, str) else type(value).__name__
        raise UsageError(f"{where}: 'header' is not a valid header name: {shown!r}")
    low = value.lower()
    if low in FORBIDDEN_HEADERS or low.startswith("proxy-"):
        raise UsageError(f"{where}: 'header' {value!r} is a field the proxy may not set")
    return value


def _format(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _FORMAT.match(value):
        raise UsageError(f"{where}: 'format' must be printable ASCII on one line")
    if value.count(PLACEHOLDER) != 1:
        raise UsageError(f"{where}: 'format' must contain {PLACEHOLDER} exactly once")
    return value


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise UsageError(f"{where}: 'command' must be a string")
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise UsageError(f"{where}: 'command' cannot be split: {exc}") from None
    if not argv:
        raise UsageError(f"{where}: 'command' is empty")
    return tuple(argv)


def _every(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e7:
        raise UsageError(f"{where}: 'every' must be a positive number of seconds")
    return float(value)


def _login(value: Any, where: str) -> str:
    if value != "" and value not in KINDS:
        raise UsageError(f"{where}: 'login' must be one of {', '.join(sorted(KINDS))}")
    return str(value)


def login_hosts(secrets: tuple[Secret, ...]) -> tuple[str, ...]:
    """The token hosts of the logins ``secrets`` hold (each is an inject host)."""
    kinds = dict.fromkeys(s.login for s in secrets if s.login)
    return tuple(ENDPOINTS[k].host for k in kinds)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
