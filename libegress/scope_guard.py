"""``--repos`` on the token's intercepted path: the I/O around :mod:`libegress.scope`.

:func:`admit` runs before a token host's request goes upstream.  Most requests
are judged on their line alone.  A ``POST /graphql`` has its body read (at
most :data:`~libegress.scope.MAX_GRAPHQL_BODY` bytes; the client's
``Expect: 100-continue`` is answered here, since the body is needed first),
and each mutation's node is looked up with the token, on a connection of the
proxy's own to the same host: the listed repositories' node ids (one query
for all, cached), or an issue's or pull request's repository.  A lookup that
fails refuses the request.  The body then goes upstream as read, with a
Content-Length.

A refusal is an :class:`HttpError` 403 ``blocked-by-scope`` whose message
names the method, the path (no query) and why; the connection's handler logs
it as one line and answers it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from libegress.heads import HttpError, authorization
from libegress.http1 import ClientSide, UpstreamSide
from libegress.scope import (
    BLOCKED,
    MAX_GRAPHQL_BODY,
    REPOSITORY,
    Decision,
    Scope,
    ScopeError,
    Tie,
    decide,
    graphql_ties,
    split_target,
    tied,
)

TTL = 300.0
MISS_AGAIN = 30.0
MAX_CACHED = 4096
MAX_ANSWER = 256 * 1024
LOOKUP_TIMEOUT = 15.0

_REPO_IDS = "query({vars}){{{fields}}}"
_NODE = ("query($id:ID!){node(id:$id){__typename "
         "... on Issue{repository{nameWithOwner}} "
         "... on PullRequest{repository{nameWithOwner}}}}")



@dataclass(frozen=True)
class Dialer:
    """How lookups reach the host: the intercept path's own upstream dial, and the token."""

    open: Callable[[str, int], Awaitable[UpstreamSide]]
    close: Callable[[UpstreamSide], Awaitable[None]]
    token: Callable[[], str | None]


class LookupFailed(Exception):
    """A node-id lookup gave no usable answer (the request is refused)."""


def _refusal(method: bytes, target: bytes, why: str) -> HttpError:
    path = split_target(target)[0]
    if len(path) > 200:
        path = path[:200] + "..."
    return HttpError(403, f"{BLOCKED} {method.decode('ascii', 'replace')} {path}: {why}",
                     BLOCKED)


class ReadBody(ClientSide):
    """A client whose request body the proxy has read: the exchange takes it from here.

    Everything else (the stream, the h11 connection writing the response)
    is the client's own.
    """

    def __init__(self, client: ClientSide, body: bytes) -> None:
        self.stream = client.stream
        self.limits = client.limits
        self.reader = client.reader
        self._held = None  # nothing parsed ahead: the events below are all
        self.body = body
        self._events: list[h11.Data | h11.EndOfMessage] = [h11.EndOfMessage()]
        if body:
            self._events.insert(0, h11.Data(data=body))

    async def body_event(self) -> h11.Data | h11.EndOfMessage:
        return self._events.pop(0) if len(self._events) > 1 else self._events[0]


def framed(side: ClientSide, outgoing: h11.Request) -> h11.Request:
    """``outgoing`` as it goes with ``side``'s body: a read body gets a Content-Length."""
    return with_body(outgoing, side.body) if isinstance(side, ReadBody) else outgoing


async def admit(scope: Scope, client: ClientSide, request: h11.Request, target: bytes,
                host: str, port: int, dialer: Dialer) -> ClientSide:
    """The client side to exchange the request with: ``client``, or one with its body read.

    Raises HttpError (403 blocked-by-scope) when the request is refused.
    """
    headers = list(request.headers)
    decision: Decision = decide(scope.repos, host, request.method, target, headers)
    if decision.action == "pass":
        return client
    if decision.action == "refuse":
        raise _refusal(request.method, target, decision.reason)
    body = await _read_body(client, headers, request.method, target)
    try:
        ties = graphql_ties(body)
        for tie in ties:
            if not await _tied(scope, tie, host, port, dialer):
                raise ScopeError(f"mutation {tie.mutation} on a node outside the listed "
                                 "repositories")
    except ScopeError as exc:
        raise _refusal(request.method, target, str(exc)) from None
    except LookupFailed as exc:
        raise _refusal(request.method, target, f"lookup failed: {exc}") from None
    return ReadBody(client, body)


async def _read_body(client: ClientSide, headers: list[tuple[bytes, bytes]], method: bytes,
                     target: bytes) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-length" and int(value) > MAX_GRAPHQL_BODY:
            raise _refusal(method, target, f"a GraphQL body over {MAX_GRAPHQL_BODY} bytes")
    if client.conn.they_are_waiting_for_100_continue:
        await client.send(h11.InformationalResponse(status_code=100, headers=[]))
    body = bytearray()
    while True:
        event = await client.body_event()
        if isinstance(event, h11.EndOfMessage):
            return bytes(body)
        body += event.data
        if len(body) > MAX_GRAPHQL_BODY:
            raise _refusal(method, target, f"a GraphQL body over {MAX_GRAPHQL_BODY} bytes")


def with_body(request: h11.Request, body: bytes) -> h11.Request:
    """``request`` framed for ``body`` read whole: Content-Length, no chunking, no Expect."""
    headers = [(n, v) for n, v in request.headers
               if n.lower() not in (b"content-length", b"transfer-encoding", b"expect")]
    headers.append((b"Content-Length", str(len(body)).encode()))
    return h11.Request(method=request.method, target=request.target, headers=headers)


async def _tied(scope: Scope, tie: Tie, host: str, port: int, dialer: Dialer) -> bool:
    if tie.kind == REPOSITORY:
        ids = await _repo_ids(scope, host, port, dialer)
        if tied(tie, scope.repos, ids, None):
            return True
        # A listed repository re-created since: ask again, at most every MISS_AGAIN s
        # (a stream of wrong ids must not turn into a stream of lookups).
        cached = scope.repo_ids.get(host)
        if cached is not None and time.monotonic() - (cached[1] - TTL) < MISS_AGAIN:
            return False
        scope.repo_ids.pop(host, None)
        ids = await _repo_ids(scope, host, port, dialer)
        return tied(tie, scope.repos, ids, None)
    repo = await _node_repo(scope, tie.node_id, host, port, dialer)
    return tied(tie, scope.repos, {}, repo)


async def _repo_ids(scope: Scope, host: str, port: int, dialer: Dialer) -> dict[str, str]:
    cached = scope.repo_ids.get(host)
    if cached is not None and cached[1] > time.monotonic():
        return cached[0]
    repos = sorted(scope.repos)
    variables: dict[str, str] = {}
    decls: list[str] = []
    fields: list[str] = []
    for i, key in enumerate(repos):
        owner, _, name = key.partition("/")
        variables[f"o{i}"], variables[f"n{i}"] = owner, name
        decls.append(f"$o{i}:String!,$n{i}:String!")
        fields.append(f"r{i}:repository(owner:$o{i},name:$n{i}){{id}}")
    data = await _graphql(_REPO_IDS.format(vars=",".join(decls), fields=" ".join(fields)),
                          variables, host, port, dialer)
    ids: dict[str, str] = {}
    for i, key in enumerate(repos):
        entry = data.get(f"r{i}")
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            ids[key] = entry["id"]
    scope.repo_ids[host] = (ids, time.monotonic() + TTL)
    return ids


async def _node_repo(scope: Scope, node_id: str, host: str, port: int,
                     dialer: Dialer) -> str | None:
    cached = scope.nodes.get((host, node_id))
    if cached is not None and cached[1] > time.monotonic():
        return cached[0]
    data = await _graphql(_NODE, {"id": node_id}, host, port, dialer)
    node = data.get("node")
    repo = node.get("repository") if isinstance(node, dict) else None
    name = repo.get("nameWithOwner") if isinstance(repo, dict) else None
    answer = name if isinstance(name, str) else None
    if len(scope.nodes) >= MAX_CACHED:
        scope.nodes.clear()
    scope.nodes[(host, node_id)] = (answer, time.monotonic() + TTL)
    return answer


async def _graphql(query: str, variables: dict[str, str], host: str, port: int,
                   dialer: Dialer) -> dict[str, Any]:
    """``data`` of one GraphQL query the proxy asks with the token; LookupFailed otherwise."""
    value = dialer.token()
    if value is None:
        raise LookupFailed("no token yet")
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = h11.Request(method="POST", target="/graphql", headers=[
        (b"Host", host.encode() if port == 443 else f"{host}:{port}".encode()),
        (b"Authorization", authorization(host, value)),
        (b"Content-Type", b"application/json"),
        (b"Accept", b"application/json"),
        (b"User-Agent", b"egress-proxy"),
        (b"Content-Length", str(len(body)).encode()),
    ])
    try:
        upstream = await dialer.open(host, port)
    except HttpError as exc:
        raise LookupFailed(f"{host}: {exc}") from None
    try:
        status, answer = await asyncio.wait_for(_ask(upstream, request, body), LOOKUP_TIMEOUT)
    except (HttpError, OSError, ssl.SSLError, h11.ProtocolError, TimeoutError) as exc:
        raise LookupFailed(f"{host}: {type(exc).__name__}") from None
    finally:
        await dialer.close(upstream)
    if status != 200:
        raise LookupFailed(f"{host} answered {status}")
    try:
        data = json.loads(answer).get("data")
    except (ValueError, AttributeError, RecursionError):
        raise LookupFailed(f"{host} answered no JSON object") from None
    if not isinstance(data, dict):
        raise LookupFailed(f"{host} answered no data")
    return data


async def _ask(upstream: UpstreamSide, request: h11.Request, body: bytes) -> tuple[int, bytes]:
    await upstream.send(request, h11.Data(data=body), h11.EndOfMessage())
    status = 0
    answer = bytearray()
    while True:
        event = await upstream.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            answer += event.data
            if len(answer) > MAX_ANSWER:
                raise HttpError(502, "the lookup's answer is too large")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(answer)
        elif isinstance(event, h11.ConnectionClosed):
            raise HttpError(502, "the upstream closed during the lookup")
