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
- Codex: ``auth.json``, ``tokens`` = ``id_token``, ``access_token`` (JWTs),
  ``refresh_token``, ``account_id``, and ``last_refresh``; the expiry is the
  access token's ``exp`` claim (Codex decodes it, never verifies it);
  refreshed by a JSON POST to ``auth.openai.com/oauth/token`` (``client_id``,
  ``grant_type``, ``refresh_token``); the answer holds new ``id_token``,
  ``access_token`` and (rotated) ``refresh_token``.
- Gemini CLI: ``oauth_creds.json``, flat: ``access_token``, ``refresh_token``,
  ``expiry_date`` (ms), ``scope``; refreshed as google-auth-library does, a
  form POST to ``oauth2.googleapis.com/token`` with Gemini CLI's installed-app
  client id and (public) secret; Google's answer usually keeps the refresh
  token (no rotation) and gives ``expires_in``.

A refusal is a :class:`LoginError` that never holds a token.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping
from typing import Any

from libbroker.named_tuple import NamedTuple

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
CODEX = Kind("codex", "https://auth.openai.com/oauth/token", "app_EMoamEEZ73f0CkXaXp7hrann",
             "tokens")
# An installed application's client secret is public by design (RFC 8252 8.5):
# Gemini CLI ships it in its bundle.
GEMINI = Kind("gemini", "https://oauth2.googleapis.com/token",
              "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com", "")
GEMINI_SECRET = "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"  # noqa: S105 - public, see above
KINDS = {k.name: k for k in (CLAUDE, CODEX, GEMINI)}
# The keeper's exit status for "no login file": nothing to hold yet, and nothing to
# say (a session that may make the first login inside: libegress.tokens is quiet).
ABSENT_STATUS = 3
# Codex without an exp claim refreshes 8 days after last_refresh (its own rule).
CODEX_INTERVAL_MS = 8 * 24 * 3600 * 1000


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
    login = (data if not kind.key else data.get(kind.key)) if isinstance(data, dict) else None
    if not isinstance(login, dict):
        raise LoginError(f"{kind.name}'s login file holds no {kind.key or 'login'}")
    if kind is GEMINI:
        return data, _flat_tokens(kind, login)
    if kind is CODEX:
        return data, _codex_tokens(data, login)
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


def _codex_tokens(data: Mapping[str, Any], login: Mapping[str, Any]) -> Tokens:
    access, refresh = login.get("access_token"), login.get("refresh_token")
    if not _is_token(access) or not _is_token(refresh):
        raise LoginError("codex's login has no usable access and refresh token")
    assert isinstance(access, str) and isinstance(refresh, str)
    expires = jwt_exp_ms(access)
    if expires is None:
        expires = _iso_ms(data.get("last_refresh")) + CODEX_INTERVAL_MS
    return Tokens(access, refresh, expires, ())


def _flat_tokens(kind: Kind, login: Mapping[str, Any]) -> Tokens:
    access, refresh = login.get("access_token"), login.get("refresh_token")
    expires = login.get("expiry_date")
    if not _is_token(access) or not _is_token(refresh):
        raise LoginError(f"{kind.name}'s login has no usable access and refresh token")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise LoginError(f"{kind.name}'s login has no expiry")
    assert isinstance(access, str) and isinstance(refresh, str)
    scope = login.get("scope")
    return Tokens(access, refresh, int(expires), tuple(scope.split()) if isinstance(scope, str)
                  else ())


def jwt_claims(token: str) -> dict[str, Any] | None:
    """A JWT's payload, decoded (never verified), or None when it is not one."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None


def jwt_exp_ms(token: str) -> int | None:
    exp = (jwt_claims(token) or {}).get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return int(exp * 1000)


def _iso_ms(value: object) -> int:
    """``last_refresh`` (RFC 3339) in ms; 0 (long ago) when absent or unreadable."""
    if not isinstance(value, str):
        return 0
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def iso_now(now_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000))


def _is_token(value: object) -> bool:
    return isinstance(value, str) and bool(_TOKEN.match(value))


def needs_refresh(tokens: Tokens, now_ms: int, margin_ms: int = MARGIN_MS) -> bool:
    return tokens.expires_ms - now_ms <= margin_ms


def content_type(kind: Kind) -> str:
    return "application/x-www-form-urlencoded" if kind is GEMINI else "application/json"


def refresh_body(kind: Kind, tokens: Tokens) -> bytes:
    """The token request's JSON body, as the agent itself sends it."""
    body: dict[str, str] = {"grant_type": "refresh_token", "refresh_token": tokens.refresh,
                            "client_id": kind.client_id}
    if kind is CODEX:  # no scope: as Codex sends it
        return json.dumps(body).encode()
    if kind is GEMINI:  # a form, with the installed app's public secret
        from urllib.parse import urlencode

        return urlencode({**body, "client_secret": GEMINI_SECRET}).encode()
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
    if not _is_token(access) or not _is_token(refresh):
        raise LoginError("the token endpoint's answer holds no usable token")
    if kind is CODEX:
        return _codex_refreshed(data, got, now_ms)
    expires_in = got.get("expires_in")
    if kind is GEMINI:
        return _gemini_refreshed(data, got, expires_in, now_ms)
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


def _codex_refreshed(data: Mapping[str, Any], got: Mapping[str, Any],
                     now_ms: int) -> tuple[dict[str, Any], Tokens]:
    out = json.loads(json.dumps(data))
    login = out[CODEX.key]
    login["access_token"] = got["access_token"]
    if "refresh_token" in got:
        login["refresh_token"] = got["refresh_token"]
    id_token = got.get("id_token")
    if id_token is not None:
        if not _is_token(id_token) or jwt_claims(id_token) is None:
            raise LoginError("the token endpoint's answer holds no usable id token")
        login["id_token"] = id_token
    out["last_refresh"] = iso_now(now_ms)
    return out, _codex_tokens(out, login)


def _expires_in_ms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 10**8:
        raise LoginError("the token endpoint's answer has no usable expires_in")
    return int(value * 1000)


def _gemini_refreshed(data: Mapping[str, Any], got: Mapping[str, Any], expires_in: object,
                      now_ms: int) -> tuple[dict[str, Any], Tokens]:
    out = json.loads(json.dumps(data))
    out["access_token"] = got["access_token"]
    if "refresh_token" in got:
        out["refresh_token"] = got["refresh_token"]
    out["expiry_date"] = now_ms + _expires_in_ms(expires_in)
    for key in ("scope", "token_type", "id_token"):
        if isinstance(got.get(key), str):
            out[key] = got[key]
    return out, _flat_tokens(GEMINI, out)


def stored(kind: Kind, data: object, held: Tokens | None, got: Mapping[str, Any],
           now_ms: int) -> tuple[dict[str, Any], Tokens]:
    """The login file's JSON after a new login (a code exchanged inside the session).

    ``data`` is the file as it was (anything, or nothing: a first login),
    ``held`` its tokens if it had a usable login.  What belonged to the old
    login's account (Claude's plan, Codex's account id) is replaced; a
    refresh token the answer leaves out is the held one, else the answer is
    refused.  LoginError when the answer holds no usable login.
    """
    if not _is_token(got.get("access_token")):
        raise LoginError("the token endpoint's answer holds no usable token")
    base: dict[str, Any] = json.loads(json.dumps(data)) if isinstance(data, dict) else {}
    before = held or Tokens("", "", 0, ())
    if kind is CODEX:
        base.setdefault("OPENAI_API_KEY", None)
        login = base["tokens"] = {}
        if before.refresh:
            login["refresh_token"] = before.refresh
        claims = jwt_claims(str(got.get("id_token", ""))) or {}
        auth = claims.get("https://api.openai.com/auth")
        account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
        if not isinstance(got.get("id_token"), str) or not isinstance(account, str):
            raise LoginError("the token endpoint's answer holds no usable id token")
        login["account_id"] = account
        return _codex_refreshed(base, got, now_ms)
    if kind is CLAUDE:
        base[kind.key] = {"accessToken": "", "refreshToken": before.refresh, "expiresAt": 0,
                          "scopes": []}
    return refreshed(kind, base, before, 200, json.dumps(dict(got)).encode(), now_ms)
