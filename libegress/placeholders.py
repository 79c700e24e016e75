"""What a session holds of an agent's OAuth login: fixed placeholders (pure).

Two readers need the same words.  The launcher writes them into the
session's private copy of the login file (:func:`login_file`), and
egress-proxy hands them back when a process inside asks the token endpoint
for tokens (:func:`masked`: a token answer with every token replaced).  Every
placeholder holds :data:`MARK`, so one test says whether a request carries
one.

- Claude Code: ``sk-ant-oat01-…`` / ``sk-ant-ort01-…``;
- Codex: JWTs it can decode (the real claims, its plan and account, an
  ``exp`` in 2100) signed with the word :data:`MARK`, and ``rt_…``;
- Gemini CLI: ``ya29.…`` / ``1//…``; Google's id token (a signed JWT, a
  credential of its own) is never handed in.

The expiry is 2100-01-01, so the agent never refreshes by itself.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from typing import Any

from libegress.oauth_login import CODEX, GEMINI, Kind, iso_now, jwt_claims

MARK = "agent-sandbox-placeholder"
ACCESS = f"sk-ant-oat01-{MARK}"
REFRESH = f"sk-ant-ort01-{MARK}"
GEMINI_ACCESS = f"ya29.{MARK}"
GEMINI_REFRESH = f"1//{MARK}"
CODEX_REFRESH = f"rt_{MARK}"
FAR_AHEAD_MS = 4102444800000  # 2100-01-01: the agent never sees it near expiry
# The token fields of an OAuth answer: never handed inside as the endpoint sent them.
TOKEN_FIELDS = ("access_token", "refresh_token", "id_token")


def jwt(claims: Mapping[str, Any]) -> str:
    """An unsigned JWT of ``claims`` whose signature is :data:`MARK`."""
    def part(value: object) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(dict(claims))}.{MARK}"


def codex_tokens(id_token: object, access_token: object) -> tuple[str, str]:
    """Codex's (id token, access token) placeholders: the claims kept, exp in 2100."""
    id_claims = jwt_claims(str(id_token or "")) or {}
    access_claims = jwt_claims(str(access_token or "")) or {}
    return jwt(id_claims), jwt({**access_claims, "exp": FAR_AHEAD_MS // 1000})


def login_file(kind: Kind, data: Any, now_ms: int | None = None) -> dict[str, Any]:
    """The session's copy of a login file: what the agent needs, no real token."""
    if kind is CODEX:
        tokens = data.get("tokens") if isinstance(data, dict) else None
        tokens = tokens if isinstance(tokens, dict) else {}
        id_token, access = codex_tokens(tokens.get("id_token"), tokens.get("access_token"))
        return {"OPENAI_API_KEY": None,
                "tokens": {"id_token": id_token, "access_token": access,
                           "refresh_token": CODEX_REFRESH, "account_id": tokens.get("account_id")},
                "last_refresh": iso_now(int(time.time() * 1000) if now_ms is None else now_ms)}
    if kind is GEMINI:
        scope = data.get("scope") if isinstance(data, dict) else None
        return {"access_token": GEMINI_ACCESS, "refresh_token": GEMINI_REFRESH,
                "scope": scope if isinstance(scope, str) else "", "token_type": "Bearer",
                "expiry_date": FAR_AHEAD_MS}
    inner = data.get(kind.key) if isinstance(data, dict) else None
    kept = {k: v for k, v in (inner if isinstance(inner, dict) else {}).items()
            if k in ("scopes", "subscriptionType", "rateLimitTier")}
    return {kind.key: {**kept, "accessToken": ACCESS, "refreshToken": REFRESH,
                       "expiresAt": FAR_AHEAD_MS}}


def masked(kind: Kind, got: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    """The token answer ``got`` as the session gets it: placeholders, expiry in 2100.

    Whatever else the endpoint said (scope, token type, Claude's account and
    organization) goes in unchanged; a field named like a token never does.
    """
    out = {k: v for k, v in got.items() if k not in TOKEN_FIELDS and k != "expires_in"}
    out["expires_in"] = max(1, (FAR_AHEAD_MS - now_ms) // 1000)
    out.setdefault("token_type", "Bearer")
    if kind is CODEX:
        out["id_token"], out["access_token"] = codex_tokens(got.get("id_token"),
                                                            got.get("access_token"))
        out["refresh_token"] = CODEX_REFRESH
    elif kind is GEMINI:
        out["access_token"], out["refresh_token"] = GEMINI_ACCESS, GEMINI_REFRESH
    else:
        out["access_token"], out["refresh_token"] = ACCESS, REFRESH
    return out


def as_answer(kind: Kind, data: Mapping[str, Any]) -> dict[str, Any]:
    """A login file's JSON read as the token answer that would have made it.

    What the proxy masks when it answers a refresh from inside itself: the
    claims Codex reads come from the person's own id token, the scopes from
    the file.
    """
    if kind is CODEX:
        tokens = data.get("tokens")
        tokens = tokens if isinstance(tokens, dict) else {}
        return {"id_token": tokens.get("id_token"), "access_token": tokens.get("access_token")}
    if kind is GEMINI:
        scope = data.get("scope")
        return {"scope": scope} if isinstance(scope, str) else {}
    inner = data.get(kind.key)
    scopes = inner.get("scopes") if isinstance(inner, dict) else None
    if isinstance(scopes, list) and all(isinstance(s, str) for s in scopes):
        return {"scope": " ".join(scopes)}
    return {}
