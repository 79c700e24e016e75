"""A held login's token host on the intercepted path: the I/O around :mod:`.token_endpoint`.

Reached from :func:`libegress.intercept.serve_intercepted` when the CONNECT
host is the token host of a login the session's secrets hold.  Every request
is read whole (at most :data:`~.token_endpoint.MAX_BODY`), judged, and:

- ANSWER: the keeper (the login's own secret command, ``--answer``) prints the
  placeholder answer, sent as a 200; nothing goes upstream;
- EXCHANGE: upstream with no credential; a 200 token answer goes to the
  keeper (``--store``), which writes it to the person's login file, and the
  session gets what the keeper prints (placeholders); the login's secrets
  read the new token at once;
- INJECT / FORWARD: upstream with the real access token in place of the
  placeholder (Gemini's tokeninfo), or as the request came (its own
  Authorization, if any; nothing added); an answer holding a token field is
  not handed in (502);
- RELAY: another OAuth client's token request (gcloud's): upstream as it
  came, its answer relayed; nothing of the person's goes with it;
- REFUSE: one log line and the refusal, ``X-Proxy-Error: blocked-login``.

A placeholder never goes upstream from here (a request carrying one is
answered, injected or refused).  Answers are read
whole (at most :data:`~.token_endpoint.MAX_ANSWER`): token hosts answer small.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11

from libbroker.errors import TokenError
from libegress.context import Services
from libegress.heads import HttpError, forward_headers
from libegress.http1 import ClientSide, Exchanged, UpstreamSide
from libegress.outcome import Mode
from libegress.placeholders import MARK, TOKEN_FIELDS
from libegress.scope_guard import with_body
from libegress.token_endpoint import (
    ENDPOINTS,
    MAX_ANSWER,
    MAX_BODY,
    REFUSED,
    Action,
    Endpoint,
    holds_tokens,
    judge,
    token_answer,
)
from libegress.tokens import RUN_BOUND, SecretKeeper, distinct, run_command

Upstream = Callable[[], Awaitable[UpstreamSide]]
# (the credential to set, whether the client's own Authorization goes as it came)
Outgoing = Callable[["tuple[bytes, bytes] | None", bool], h11.Request]


@dataclass(frozen=True)
class HeldLogin:
    """A login the secrets hold, at its token host."""

    endpoint: Endpoint
    argv: tuple[str, ...]  # the keeper's command (the login's first secret's)
    keepers: tuple[SecretKeeper, ...]  # every secret of the login: re-read after a store
    here: SecretKeeper | None  # the token host's own secret (Gemini's tokeninfo), if any


def held_login(services: Services, host: str) -> HeldLogin | None:
    """The login whose token host is ``host``, if the secrets hold one."""
    keepers = [k for k in services.secrets.values()
               if k.secret.login and ENDPOINTS[k.secret.login].host == host]
    if not keepers:
        return None
    kind = keepers[0].secret.login
    same = tuple(k for k in services.secrets.values() if k.secret.login == kind)
    return HeldLogin(ENDPOINTS[kind], keepers[0].secret.argv, same, services.secrets.get(host))


async def serve_login(services: Services, login: HeldLogin, client: ClientSide,
                      request: h11.Request, target: bytes, upstream: Upstream,
                      outgoing: Outgoing) -> None:
    """Serve one request to the token host (its target held to the host already).

    Raises HttpError for a refusal: the connection's handler logs it as one
    line and answers it.  ``outgoing`` makes the upstream request with the
    given credential, or with the client's own Authorization kept.
    """
    moved, started = Exchanged(), time.monotonic()
    headers = list(request.headers)
    body = await _read_body(client, headers)
    moved.up = len(body)
    decision = judge(login.endpoint, request.method, target, headers, body)
    if decision.action is Action.REFUSE:
        raise HttpError(decision.status, decision.reason, REFUSED)
    if decision.action is Action.ANSWER:
        await _answered(client, services, login, None, moved)
    else:
        own = decision.action in (Action.FORWARD, Action.RELAY)
        await _upstream(client, services, login, await upstream(), decision.action,
                        outgoing(_credential(login, decision.action), own), body, moved)
    # --record: method, path (no query), status, bytes; never a header or a body
    services.record.request(Mode.INTERCEPT, login.endpoint.host, 443, request.method, target,
                            moved, started)


def _credential(login: HeldLogin, action: Action) -> tuple[bytes, bytes] | None:
    """The real access token, on the paths that need it only."""
    if action is Action.INJECT and login.here is not None:
        return login.here.field()
    return None


async def _upstream(client: ClientSide, services: Services, login: HeldLogin,
                    upstream: UpstreamSide, action: Action, request: h11.Request, body: bytes,
                    moved: Exchanged) -> None:
    """Ask upstream; a new login's tokens kept on the host, any other token not handed in."""
    status, head, answer = await _ask(upstream, with_body(request, body), body)
    if action is Action.EXCHANGE and status == 200 and token_answer(answer) is not None:
        await _answered(client, services, login, answer, moved)
        return
    if action is not Action.RELAY and holds_tokens(answer):
        raise HttpError(502, f"{login.endpoint.host} answered with a token the session may "
                        "not hold: not handed in", REFUSED)
    moved.status, moved.down = status, len(answer)
    await _relay(client, request.method, status, head, answer)


async def _answered(client: ClientSide, services: Services, login: HeldLogin,
                    store: bytes | None, moved: Exchanged) -> None:
    """The keeper's answer (placeholders), sent; with ``store``, the new login kept first."""
    word = "--answer" if store is None else "--store"
    name = login.endpoint.kind.name
    try:
        out = await run_command([*login.argv, word], RUN_BOUND, store or b"",
                                login.keepers[0].env)
        answer = json.loads(out)
        if not isinstance(answer, dict) or holds_real(answer):
            raise ValueError
        refused = answer.get("refused")
        if refused is not None and not (isinstance(refused, str) and refused.isprintable()
                                        and len(refused) <= 300):
            raise ValueError
    except (TokenError, ValueError, RecursionError, UnicodeDecodeError):
        what = "answer the refresh" if store is None else "keep the new login"
        raise HttpError(502, f"{name}'s login is held on the host: the keeper could not "
                        f"{what}", REFUSED) from None
    if isinstance(refused, str):  # a login for another account: the host's file unchanged
        raise HttpError(403, refused, REFUSED)
    if store is not None:
        services.log.note(f"{name}'s new login (a code exchanged inside the session) is kept "
                          "in the person's login file; the session holds placeholders")
        await asyncio.gather(*(k.refresh() for k in distinct([s.keeper for s in login.keepers])))
    data = json.dumps(answer).encode()
    moved.status, moved.down = 200, len(data)
    await client.send(h11.Response(status_code=200, headers=[
        (b"Content-Type", b"application/json"), (b"Content-Length", str(len(data)).encode()),
        (b"Cache-Control", b"no-store")]), h11.Data(data=data), h11.EndOfMessage())


def holds_real(answer: dict[str, object]) -> bool:
    """Whether an answer for the session has a token field that is not a placeholder."""
    return any(isinstance(answer.get(f), str) and MARK not in str(answer[f])
               for f in TOKEN_FIELDS)


async def _read_body(client: ClientSide, headers: list[tuple[bytes, bytes]]) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-length" and value.isdigit() and int(value) > MAX_BODY:
            raise HttpError(413, f"a request to a login's token host over {MAX_BODY} bytes",
                            REFUSED)
    if client.conn.they_are_waiting_for_100_continue:
        await client.send(h11.InformationalResponse(status_code=100, headers=[]))
    body = bytearray()
    while True:
        event = await client.body_event()
        if isinstance(event, h11.EndOfMessage):
            return bytes(body)
        body += event.data
        if len(body) > MAX_BODY:
            raise HttpError(413, f"a request to a login's token host over {MAX_BODY} bytes",
                            REFUSED)


async def _ask(upstream: UpstreamSide, request: h11.Request,
               body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Send ``request`` and ``body``; the answer's status, fields and body, read whole."""
    await upstream.send(request, *((h11.Data(data=body),) if body else ()), h11.EndOfMessage())
    head: h11.Response | None = None
    answer = bytearray()
    while True:
        event = await upstream.next_event()
        if isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            answer += event.data
            if len(answer) > MAX_ANSWER:
                raise HttpError(502, "the token host's answer is over 1 MiB")
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            return head.status_code, list(head.headers), bytes(answer)
        elif isinstance(event, h11.ConnectionClosed):
            raise HttpError(502, "the token host closed without an answer")


async def _relay(client: ClientSide, method: bytes, status: int,
                 headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    kept = [(n, v) for n, v in forward_headers(headers, drop_auth=False)
            if n.lower() not in (b"content-length", b"transfer-encoding")]
    kept.append((b"Content-Length", str(len(body)).encode()))
    events: list[h11.Event] = [h11.Response(status_code=status, headers=kept)]
    if body and method != b"HEAD":
        events.append(h11.Data(data=body))
    events.append(h11.EndOfMessage())
    await client.send(*events)
