"""An agent's OAuth token host, as egress-proxy serves it for a held login (pure).

When a session's login stays on the host (``[[secret]]`` entries with a
``login`` kind), the agent's token host is an inject host: TLS ends at the
proxy and every request to it is judged here, before anything goes upstream.
The real refresh token never goes in and never goes out from here: only the
host-side keeper (:mod:`libegress.login_keeper`) sends it.

- ``POST`` of the token path (read in the installed CLIs: Claude Code's
  ``platform.claude.com/v1/oauth/token``, JSON; Codex's
  ``auth.openai.com/oauth/token``, JSON for a refresh and a form for the
  code; Gemini CLI's ``oauth2.googleapis.com/token``, a form):

  - ``grant_type=refresh_token`` with the session's placeholder: ANSWER,
    the proxy answers with fresh placeholders (the keeper keeps the real
    pair fresh; the proxy goes on setting the real access token);
  - ``grant_type=authorization_code`` with the agent's own client id (a
    ``/login`` inside): EXCHANGE, the code goes upstream, and a token answer
    is written to the person's own login file by the keeper; the session
    gets placeholders;
  - another client's request (a ``client_id`` that is not the agent's, no
    placeholder anywhere: gcloud refreshing its own ADC on
    ``oauth2.googleapis.com``): RELAY, upstream as it came, its answer
    relayed; the proxy adds nothing, so nothing of the person's is in it;
  - any other grant, or a refresh token that is not the placeholder:
    REFUSE 403 (a refresh token of another account would otherwise be
    answered with a login that is not the person's);
- a path that needs the real token (Gemini CLI's ``/tokeninfo``, which it
  asks with the bearer before it trusts a login): INJECT when the request's
  Authorization holds the placeholder (the placeholder replaced); a bearer
  of the client's own goes as it came (FORWARD);
- anything else carrying a placeholder (in the target, a header or the
  body): REFUSE 403; else FORWARD: the client's own fields, no credential added.

A response to INJECT or FORWARD that holds a token field is not handed in
(:func:`holds_tokens`).  Paths are compared decoded, lower case, with
repeated and trailing slashes gone, so ``//v1/OAuth/token/`` is the token
path too.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from libbroker.named_tuple import NamedTuple
from libegress.oauth_login import KINDS, Kind
from libegress.placeholders import MARK, TOKEN_FIELDS

MAX_BODY = 256 * 1024  # a token request is a few hundred bytes
MAX_ANSWER = 1 << 20
REFUSED = "blocked-login"


class Action(Enum):
    ANSWER = "answer"  # the proxy answers a refresh with placeholders
    EXCHANGE = "exchange"  # upstream; a token answer is kept on the host
    INJECT = "inject"  # upstream with the real access token (the placeholder replaced)
    FORWARD = "forward"  # upstream as it came, no credential added; no token handed in
    RELAY = "relay"  # another client's token request: upstream as it came, answer relayed
    REFUSE = "refuse"


class Decision(NamedTuple):
    action: Action
    status: int = 0
    reason: str = ""


class Endpoint(NamedTuple):
    """One agent's token host: the token path and the paths that get the real token."""

    kind: Kind
    host: str
    token_path: str
    inject_paths: frozenset[str]


def _endpoint(kind: Kind, inject: tuple[str, ...] = ()) -> Endpoint:
    url = urlsplit(kind.token_url)
    return Endpoint(kind, url.hostname or "", url.path, frozenset(inject))


# Gemini CLI asks tokeninfo with ``Authorization: Bearer`` before it trusts a
# cached login; nothing else on oauth2.googleapis.com gets the real token.
ENDPOINTS = {
    "claude": _endpoint(KINDS["claude"]),
    "codex": _endpoint(KINDS["codex"]),
    "gemini": _endpoint(KINDS["gemini"], ("/tokeninfo",)),
}


def path_key(target: bytes) -> str:
    """The request's path as it is compared: no query, decoded, lower case, slashes tidied."""
    path = target.split(b"?", 1)[0].decode("latin-1")
    for _ in range(3):  # %252F: decoded until it stops changing (at most three times)
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    path = re.sub(r"/{2,}", "/", path.lower()).rstrip("/")
    return path or "/"


def _decoded(data: bytes) -> str:
    text = data.decode("utf-8", "replace")
    for _ in range(3):
        decoded = unquote(text.replace("+", " "))
        if decoded == text:
            break
        text = decoded
    return text


def carries_mark(target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Whether the request holds a placeholder anywhere it could be read from."""
    if MARK in _decoded(target) or MARK in _decoded(body):
        return True
    if any(MARK in _decoded(value) for _, value in headers):
        return True
    try:  # JSON may spell it with \\u escapes
        return MARK in json.dumps(json.loads(body)) if body else False
    except (ValueError, RecursionError):
        return False


def _content_type(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.decode("latin-1").split(";")[0].strip().lower()
    return ""


def params(headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any] | None:
    """A token request's parameters (a JSON object or a form); None when neither."""
    ctype = _content_type(headers)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if ctype == "application/json" or (not ctype and text.lstrip().startswith("{")):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None
    if ctype in ("application/x-www-form-urlencoded", ""):
        pairs = parse_qsl(text, keep_blank_values=True)
        names = [n for n, _ in pairs]
        if len(names) != len(set(names)):  # one value per name, or which one is meant?
            return None
        return dict(pairs)
    return None


def carries_placeholder(headers: list[tuple[bytes, bytes]], name: bytes = b"authorization") -> bool:
    """Whether the request's ``name`` field (lower case) holds a placeholder: the proxy
    replaces a placeholder, never a credential the request brought itself."""
    return any(n.lower() == name and MARK in _decoded(v) for n, v in headers)


def _another_client(endpoint: Endpoint, got: dict[str, Any] | None, marked: bool) -> bool:
    """A token request of another OAuth client (its own client id, no placeholder)."""
    if got is None or marked:
        return False
    client = got.get("client_id")
    return isinstance(client, str) and bool(client) and client != endpoint.kind.client_id


def judge(endpoint: Endpoint, method: bytes, target: bytes,
          headers: list[tuple[bytes, bytes]], body: bytes) -> Decision:
    """What the proxy does with one request to ``endpoint``'s host (its body read whole)."""
    path = path_key(target)
    name = endpoint.kind.name
    if path == endpoint.token_path:
        got = params(headers, body)
        if _another_client(endpoint, got, carries_mark(target, headers, body)):
            return Decision(Action.RELAY)
        if method != b"POST":
            return Decision(Action.REFUSE, 405, f"{name}'s token endpoint takes POST only")
        if got is None:
            return Decision(Action.REFUSE, 400, f"{name}'s token request is neither JSON nor "
                                                "a form the proxy can read")
        grant = got.get("grant_type")
        if grant == "refresh_token":
            if isinstance(got.get("refresh_token"), str) and MARK in got["refresh_token"]:
                return Decision(Action.ANSWER)
            return Decision(Action.REFUSE, 403, f"{name}'s login is held on the host: only the "
                                                "session's placeholder refresh token is answered")
        if grant == "authorization_code" and not carries_mark(target, headers, body) \
                and got.get("client_id") == endpoint.kind.client_id:
            return Decision(Action.EXCHANGE)
        what = f"grant {grant!r}" if isinstance(grant, str) and len(grant) <= 80 \
            else "a token request with no readable grant_type"
        return Decision(Action.REFUSE, 403, f"{name}'s login is held on the host: {what} "
                                            "is not answered for the session")
    if path in endpoint.inject_paths and carries_placeholder(headers):
        return Decision(Action.INJECT)
    if carries_mark(target, headers, body):
        return Decision(Action.REFUSE, 403, f"{name}'s login is held on the host: the "
                                            "session's placeholder gets nothing here")
    return Decision(Action.FORWARD)


def token_answer(body: bytes) -> dict[str, Any] | None:
    """A token endpoint's 200 answer as an object with an access token, else None."""
    try:
        got = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(got, dict) or not isinstance(got.get("access_token"), str):
        return None
    return got


_NAMES = frozenset(f.replace("_", "") for f in TOKEN_FIELDS)


def holds_tokens(body: bytes) -> bool:
    """Whether an answer holds a token: a field named like one (any depth, any spelling
    of ``access_token``) with a string value; an answer that is not JSON, when it names one."""
    if not body:
        return False
    try:
        data = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        text = body.decode("utf-8", "replace").lower().replace("_", "")
        return any(n in text for n in _NAMES)
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if str(key).lower().replace("_", "").replace("-", "") in _NAMES \
                        and isinstance(value, str) and value:
                    return True
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return False
