"""An agent's OAuth login file, kept on the host and refreshed there (pure).

The agent inside a session holds placeholders (libbroker.launcher.logins);
egress-proxy sets the real access token on the agent's API host, reading it
through :mod:`libegress.login_keeper`, which refreshes it before it expires
and writes the rotated pair back to the person's own file.  This module is
what that needs without I/O: the shape of each agent's login file (read in the
installed CLI), when to refresh, the refresh request, and the file after it.

- Claude Code: ``.credentials.json``, ``claudeAiOauth`` = ``accessToken``,
  ``refreshToken``, ``expiresAt`` (ms since the epoch), ``scopes``; refreshed
  by a JSON POST to ``platform.claude.com/v1/oauth/token`` (``grant_type``
  ``refresh_token``, Claude Code's public client id, the scopes); the answer's
  ``refresh_token`` replaces the old one (it rotates), ``expires_in`` in s.

A refusal is a :class:`LoginError` that never holds a token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# Refresh this long before the expiry (Claude Code's own margin is 5 minutes).
MARGIN_MS = 5 * 60 * 1000
# What may go into a header or a file: printable ASCII, no spaces.
_TOKEN = re.compile(r"^[\x21-\x7e]{1,8192}$")


class LoginError(Exception):
    """A login file or a token answer that cannot be used (the message holds no token)."""


class Kind(NamedTuple):
    """One agent's login file: where its tokens are and how they are refreshed."""

    name: str
    token_url: str
    client_id: str
    key: str  # the object holding the tokens


CLAUDE = Kind("claude", "https://platform.claude.com/v1/oauth/token",
              "9d1c250a-e61b-44d9-88ed-5944d1962f5e", "claudeAiOauth")
KINDS = {k.name: k for k in (CLAUDE,)}


class Tokens(NamedTuple):
    access: str
    refresh: str
    expires_ms: int
    scopes: tuple[str, ...]


def parse(kind: Kind, text: str) -> tuple[dict[str, Any], Tokens]:
    """The file's JSON and its tokens; LoginError when it holds no usable login."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise LoginError(f"{kind.name}'s login file is not JSON") from None
    login = data.get(kind.key) if isinstance(data, dict) else None
    if not isinstance(login, dict):
        raise LoginError(f"{kind.name}'s login file holds no {kind.key}")
    access, refresh = login.get("accessToken"), login.get("refreshToken")
    expires = login.get("expiresAt")
    if not _is_token(access) or not _is_token(refresh):
        raise LoginError(f"{kind.name}'s login has no usable access and refresh token")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise LoginError(f"{kind.name}'s login has no expiry")
    scopes = login.get("scopes")
    scope_list = tuple(s for s in scopes if isinstance(s, str)) if isinstance(scopes, list) else ()
    assert isinstance(access, str) and isinstance(refresh, str)
    return data, Tokens(access, refresh, int(expires), scope_list)


def _is_token(value: object) -> bool:
    return isinstance(value, str) and bool(_TOKEN.match(value))


def needs_refresh(tokens: Tokens, now_ms: int, margin_ms: int = MARGIN_MS) -> bool:
    return tokens.expires_ms - now_ms <= margin_ms


def refresh_body(kind: Kind, tokens: Tokens) -> bytes:
    """The token request's JSON body, as the agent itself sends it."""
    body: dict[str, str] = {"grant_type": "refresh_token", "refresh_token": tokens.refresh,
                            "client_id": kind.client_id}
    if tokens.scopes:
        body["scope"] = " ".join(tokens.scopes)
    return json.dumps(body).encode()


def refreshed(kind: Kind, data: Mapping[str, Any], tokens: Tokens, status: int,
              answer: bytes, now_ms: int) -> tuple[dict[str, Any], Tokens]:
    """The file's JSON after a token answer, and the new tokens; LoginError if refused."""
    if status != 200:
        raise LoginError(f"the token endpoint answered {status}")
    try:
        got = json.loads(answer)
    except (ValueError, RecursionError):
        raise LoginError("the token endpoint's answer is not JSON") from None
    if not isinstance(got, dict):
        raise LoginError("the token endpoint's answer is not an object")
    access, refresh = got.get("access_token"), got.get("refresh_token", tokens.refresh)
    expires_in = got.get("expires_in")
    if not _is_token(access) or not _is_token(refresh):
        raise LoginError("the token endpoint's answer holds no usable token")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) \
            or not 0 < expires_in < 10**8:
        raise LoginError("the token endpoint's answer has no usable expires_in")
    assert isinstance(access, str) and isinstance(refresh, str)
    expires_ms = now_ms + int(expires_in * 1000)
    out = json.loads(json.dumps(data))
    login = out[kind.key]
    login.update(accessToken=access, refreshToken=refresh, expiresAt=expires_ms)
    scope = got.get("scope")
    if isinstance(scope, str) and scope.strip():
        login["scopes"] = scope.split()
    return out, Tokens(access, refresh, expires_ms, tuple(login.get("scopes") or ()))
