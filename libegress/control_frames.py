"""The gateway's control protocol: one JSON object per line each way (pure).

Requests (see docs/gateway.md)::

    {"op": "add", "tenant": NAME, "password": OPTIONAL, "policy": {...}, "env": OPTIONAL}
    {"op": "remove", "tenant": NAME}
    {"op": "list"}

``policy`` holds a tenant's own egress-proxy options under their flag names
without dashes (``allow``, ``allow_cidr``, ``resolve``, ``inject``,
``secrets``, ``repos``, ``record``, ``egress_dir``, ``token_command``,
``token_every``, ``learn``, ``max_conns``, ``log``: the tenant's own log lines,
besides the gateway's); :func:`policy_args` turns it into the argument
dictionary the command line gives, so a tenant's options are checked by the
very code that checks the flags.  Every reply is ``{"ok": true, ...}`` or
``{"ok": false, "error": TEXT}``; a malformed line gets the latter and the
connection stays usable.

``env`` (optional) is the environment the tenant's token and secret commands
run with, as a session's own proxy would have inherited it from its launcher
(``printenv ANTHROPIC_API_KEY``, ``gh auth token``): names and values are
checked, a value is never echoed in an error, and it is held in memory only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from libegress.proxyauth import PASSWORD, TENANT_NAME

MAX_LINE = 64 * 1024

# policy key -> (command-line flag, JSON type it takes)
POLICY_KEYS: dict[str, tuple[str, type]] = {
    "allow": ("--allow", str),
    "allow_cidr": ("--allow-cidr", list),
    "resolve": ("--resolve", list),
    "inject": ("--inject", str),
    "secrets": ("--secrets", str),
    "repos": ("--repos", str),
    "record": ("--record", str),
    "egress_dir": ("--egress-dir", str),
    "token_command": ("--token-command", str),
    "token_every": ("--token-every", str),
    "learn": ("--learn", bool),
    "max_conns": ("--max-conns", str),
    "log": ("--log", str),
}


class BadFrame(ValueError):
    """A request line the gateway cannot act on; the message says why."""


@dataclass(frozen=True)
class Add:
    tenant: str
    password: str | None
    policy: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] | None = None  # the tenant's commands' environment (None: the gateway's)


@dataclass(frozen=True)
class Remove:
    tenant: str


@dataclass(frozen=True)
class List:
    pass


Request = Add | Remove | List


def _tenant(frame: dict[str, Any]) -> str:
    name = frame.get("tenant")
    if not isinstance(name, str) or not TENANT_NAME.match(name):
        raise BadFrame("\"tenant\" must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)")
    return name


def _policy(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadFrame("\"policy\" must be an object")
    for key, value in raw.items():
        if key not in POLICY_KEYS:
            raise BadFrame(f"unknown policy key {key!r}; known: {', '.join(POLICY_KEYS)}")
        kind = POLICY_KEYS[key][1]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in ("token_every", "max_conns") and number:
            continue
        if isinstance(value, list):
            ok = kind is list and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, kind)
        if not ok:
            wanted = "list of strings" if kind is list else kind.__name__
            raise BadFrame(f"policy {key!r} must be a {wanted}")
    return dict(raw)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
MAX_ENV = 1024  # variables in one tenant's command environment


def _env(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_ENV:
        raise BadFrame(f"\"env\" must be an object of at most {MAX_ENV} variables")
    for name, value in raw.items():
        if not _ENV_NAME.match(name):
            raise BadFrame("\"env\" holds a name that is no variable name")
        if not isinstance(value, str) or "\0" in value:
            # The value is never echoed: it may be a key.
            raise BadFrame(f"\"env\" value of {name} must be a string without NUL")
    return dict(raw)


def parse_request(line: bytes) -> Request:
    """The request on one line (without its newline); BadFrame naming what is wrong."""
    try:
        frame = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadFrame("not a JSON object on one line") from None
    if not isinstance(frame, dict):
        raise BadFrame("not a JSON object on one line")
    op = frame.get("op")
    known = {"add": {"op", "tenant", "password", "policy", "env"}, "remove": {"op", "tenant"},
             "list": {"op"}}
    if op not in known:
        raise BadFrame("\"op\" must be one of add, remove, list")
    extra = sorted(set(frame) - known[op])
    if extra:
        raise BadFrame(f"unknown key {extra[0]!r} for {op}")
    if op == "list":
        return List()
    if op == "remove":
        return Remove(_tenant(frame))
    password = frame.get("password")
    if password is not None and (not isinstance(password, str) or not PASSWORD.match(password)):
        # Never echoed: it may be a real secret sent by mistake.
        raise BadFrame("\"password\" must be 24-255 printable ASCII characters without spaces")
    return Add(_tenant(frame), password, _policy(frame.get("policy")), _env(frame.get("env")))


def policy_args(policy: dict[str, Any], listen: str) -> dict[str, Any]:
    """``policy`` as the docopt dictionary ``options_from_args`` checks.

    ``listen`` is the gateway's own listener: the checker wants one, and a
    tenant has none of its own.
    """
    args: dict[str, Any] = {"--listen": listen}
    for key, value in policy.items():
        flag = POLICY_KEYS[key][0]
        args[flag] = str(value) if key in ("token_every", "max_conns") else value
    return args


def reply(ok: bool, **fields: Any) -> bytes:
    """One reply line."""
    body: dict[str, Any] = {"ok": ok, **fields}
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()
