"""HTTP/1.1 through h11 on both sides of the proxy, bodies streamed.

:class:`ClientSide` reads requests from the sandbox through
:class:`~libegress.heads.RequestReader` (head limits and screening on head bytes
only, then h11) and adds the reads and their deadlines.  :class:`UpstreamSide`
is h11's client role.  :func:`keep_alive` is the one request loop of a client
connection (the plain-HTTP listener and the inject path each bring a
:class:`Exchanges`).  :func:`exchange` relays one request and its response, the
request body and the response in two tasks (``Expect: 100-continue`` and early
responses need both at once), never holding a whole body: one read at a time
moves through, so memory stays bounded whatever the body's size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import h11

from libegress.bulk_body import bulk_left, chunked_ready, move, move_chunked
from libegress.heads import Headers, RequestReader, forward_headers
from libegress.heads import HttpError as HttpError  # re-exported: its old home
from libegress.limits import Limits as Limits  # re-exported: its old home
from libegress.streams import Stream

_T = TypeVar("_T")
_E = TypeVar("_E", bound=h11.Event)


def error_events(status: int, message: str, kind: str | None, *,
                 body: bool = True) -> list[h11.Event]:
    """A short plain-text response, closing the connection.

    ``body=False`` for the answer to HEAD: the same status and fields (its
    Content-Length is the body a GET would get, RFC 9110 9.3.2), no body.
    h11 refuses a body after a HEAD, so sending one would send nothing at all.
    """
    text = f"egress-proxy: {message}\n".encode("utf-8", "replace")
    headers: Headers = [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(text)).encode()),
        (b"Connection", b"close"),
    ]
    if kind:
        headers.append((b"X-Proxy-Error", kind.encode()))
    if status == 407:  # the gateway's refusal: RFC 9110 11.7.1
        headers.append((b"Proxy-Authenticate", b'Basic realm="egress-proxy"'))
    from http import HTTPStatus  # its ~60-member enum with the first answer of our own

    try:
        phrase = HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    response = h11.Response(status_code=status, headers=headers, reason=phrase)
    if not body:
        return [response, h11.EndOfMessage()]
    return [response, h11.Data(data=text), h11.EndOfMessage()]


def serialised(conn: h11.Connection, events: tuple[h11.Event, ...]) -> bytes:
    """``events`` as bytes; a lone Content-Length body piece is not copied."""
    pieces = [piece for e in events for piece in conn.send_with_data_passthrough(e) or ()]
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


GATHER = 256 * 1024  # the most body bytes joined into one piece


def gathered(first: h11.Data,
             parsed: Callable[[], h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]]
             ) -> tuple[h11.Data, Any]:
    """``first`` joined with the Data h11 can give now without reading, up to GATHER bytes.

    A chunked body comes from h11 one chunk at a time, and each piece costs a
    send (and its TLS records) on the other side: chunks of 16 KiB cost the
    inject path six times the CPU of a Content-Length body.  Joined, they go
    out a read's worth at a time (as a Content-Length body does; chunk
    boundaries are hop-by-hop).  Also returned: the event that stopped the
    gathering (EndOfMessage, say), or the HttpError parsing raised, for the
    caller to give next, so that the bytes before it still go first; None when
    h11 needs data.
    """
    pieces, size = [first.data], len(first.data)
    held: Any = None
    while size < GATHER:
        try:
            event = parsed()
        except HttpError as exc:
            held = exc
            break
        if not isinstance(event, h11.Data):
            if event is not h11.NEED_DATA and event is not h11.PAUSED:
                held = event
            break
        pieces.append(event.data)
        size += len(event.data)
    if len(pieces) == 1:
        return first, held
    return h11.Data(data=b"".join(pieces)), held


LINGER_SECONDS = 2.0  # how long a refused client may go on sending before the close
LINGER_BYTES = 8 * 1024 * 1024  # and how much of it is read and dropped


class _Gathering(Generic[_E]):
    """A side whose body pieces are gathered (:func:`gathered`): the event that ended a
    gathering is held, and given (or raised) before anything is read again."""

    _held: _E | HttpError | None = None

    def nothing_held(self) -> bool:
        """Whether no event parsed ahead waits to be given (a pump may go first)."""
        return self._held is None

    def _take_held(self) -> _E | None:
        """The event held by the last gathering, now given; its HttpError raised."""
        held, self._held = self._held, None
        if isinstance(held, HttpError):
            raise held
        return held


class ClientSide(_Gathering[h11.EndOfMessage]):
    """The sandbox's end of an HTTP connection (h11 server role)."""

    def __init__(self, stream: Stream, limits: Limits) -> None:
        self.stream = stream
        self.limits = limits
        self.reader = RequestReader(limits)
        self.method: bytes | None = None  # the current request's, once its head is read

    @property
    def conn(self) -> h11.Connection:
        """The h11 connection of the current request (and writer of its response)."""
        return self.reader.conn

    async def next_request(self) -> h11.Request | None:
        """The next request; None when the client ends the connection idle.

        Before a request's first byte the connection may idle for
        ``idle_timeout``; from that byte on the whole head must arrive within
        ``head_timeout`` (a deadline, not a per-read timeout: a client
        dribbling one byte at a time is cut off like a silent one).
        """
        self.method = None
        loop = asyncio.get_running_loop()
        # Bytes carried over from the previous request are this head's first.
        deadline = loop.time() + self.limits.head_timeout if self.reader.in_head else None
        while (event := self.reader.next_event()) is h11.NEED_DATA:
            wait = self.limits.idle_timeout if deadline is None else deadline - loop.time()
            try:
                data = await asyncio.wait_for(self.stream.recv(), max(wait, 0.0))
            except TimeoutError:
                if deadline is None:
                    raise HttpError(408, f"no request within {self.limits.idle_timeout:g}s "
                                    "of idle time") from None
                raise HttpError(408, "the request head was not complete within "
                                f"{self.limits.head_timeout:g}s") from None
            self.reader.receive_data(data)
            if deadline is None:
                deadline = loop.time() + self.limits.head_timeout
        if isinstance(event, h11.Request):
            self.method = event.method
            return event
        if isinstance(event, h11.ConnectionClosed):
            return None
        raise HttpError(400, "no request")

    async def body_event(self) -> h11.Data | h11.EndOfMessage:
        """The next piece of the request body: a read's worth (chunks joined, see gathered)."""
        if (held := self._take_held()) is not None:
            return held
        while (event := self.reader.next_event()) is h11.NEED_DATA:
            try:
                data = await asyncio.wait_for(self.stream.recv(), self.limits.idle_timeout)
            except TimeoutError:
                raise HttpError(408, "the request body stalled") from None
            self.reader.receive_data(data)
        if isinstance(event, h11.Data):
            event, ended = gathered(event, self.reader.next_event)
            if ended is not None and not isinstance(ended, h11.EndOfMessage | HttpError):
                ended = HttpError(400, "the request body ended early")
            self._held = ended
            return event
        if isinstance(event, h11.EndOfMessage):
            return event
        raise HttpError(400, "the request body ended early")

    async def send(self, *events: h11.Event) -> None:
        """Serialise ``events`` with h11 and send them."""
        await self.stream.send(serialised(self.conn, events))

    async def refuse(self, error: HttpError) -> None:
        """Answer ``error`` if a response can still be sent, then let the client finish."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(OSError, h11.LocalProtocolError):
                await self.send(*error_events(error.status, str(error), error.kind,
                                              body=self.method != b"HEAD"))
                if self.reader.in_head or (self.method is not None and
                                           self.conn.their_state is h11.SEND_BODY):
                    await self._linger()

    async def _linger(self) -> None:
        """Read and drop what the client still sends of a refused request, within bounds.

        The connection closes after a refusal, and closing a socket with unread
        bytes resets it: a client still sending (an upload over a limit, a head
        too large) would get EPIPE or ECONNRESET and never read the answer that
        says why.  Until it hangs up, for at most LINGER_SECONDS and LINGER_BYTES,
        its bytes are read and dropped; then the close goes ahead regardless.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_SECONDS
        left = LINGER_BYTES
        while left > 0:
            try:
                data = await asyncio.wait_for(self.stream.recv(), deadline - loop.time())
            except TimeoutError:
                return
            if not data:
                return
            left -= len(data)

    def next_cycle(self) -> bool:
        """Carry unread bytes over to the next request; False if none may follow."""
        return self.reader.next_cycle()

    def switched_data(self) -> bytes:
        """Bytes the client sent after its CONNECT head (a TLS hello, say)."""
        return self.reader.switched_data()


class UpstreamSide(_Gathering[h11.Event]):
    """The proxy's connection to an upstream server (h11 client role)."""

    def __init__(self, stream: Stream, timeout: float) -> None:
        self.stream = stream
        self.timeout = timeout
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send(serialised(self.conn, events))

    async def next_event(self) -> h11.Event:
        """The next event of the response; body pieces a read's worth (see gathered)."""
        if (held := self._take_held()) is not None:
            return held
        while (event := self._parsed()) is h11.NEED_DATA:
            try:
                data = await asyncio.wait_for(self.stream.recv(), self.timeout)
            except TimeoutError:
                raise HttpError(504, "the upstream did not answer in time") from None
            self.conn.receive_data(data)
        if isinstance(event, h11.Data):
            event, self._held = gathered(event, self._parsed)
        return event  # type: ignore[return-value]

    def _parsed(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpError(502, f"the upstream sent a bad response: {exc}") from None

    def reusable(self) -> bool:
        """Whether another request may go on this connection."""
        if self._held is not None:
            return False
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return True
        return False


class Exchanges(Protocol):
    """What one client connection does with its requests (see :func:`keep_alive`)."""

    async def serve(self, request: h11.Request) -> bool:
        """Serve ``request`` whole; False when the connection is no longer HTTP (CONNECT)."""

    async def refuse(self, error: HttpError) -> None:
        """Log ``error`` and answer it; the connection then ends."""

    async def cycle_done(self) -> None:
        """One request and its response are through: drop an upstream that cannot be reused."""


async def keep_alive(client: ClientSide, exchanges: Exchanges) -> None:
    """Serve request after request on ``client`` until one of them ends the connection.

    It ends when the client closes while idle, when a request switches the
    connection away from HTTP, after any refusal (answered while a response
    can still be sent), and when h11 says no further request may follow.
    Transport errors propagate to the caller, which logs them.
    """
    while True:
        try:
            request = await client.next_request()
            if request is None or not await exchanges.serve(request):
                return
        except HttpError as exc:
            await exchanges.refuse(exc)
            return
        if not client.next_cycle():
            return
        await exchanges.cycle_done()


async def _pump_request_body(client: ClientSide, upstream: UpstreamSide,
                             moved: list[int], trailers: bool) -> None:
    stalled = HttpError(408, "the request body stalled")
    chunk_pumps = True  # until one moves too little to be worth its threads
    while True:
        # Then the ordinary step below reads the end of the body, or what cut it short.
        if bulk_left(client.conn, upstream.conn, client.stream, upstream.stream):
            await move(client.conn, upstream.conn, client.stream, upstream.stream,
                       client.limits.idle_timeout, stalled, moved)
        elif chunk_pumps and (scan := chunked_ready(
                client.conn, upstream.conn, client.stream, upstream.stream, moved[0])) and (
                client.nothing_held()):
            chunk_pumps = await move_chunked(client.conn, client.stream, upstream.stream, scan,
                                             client.limits.idle_timeout, stalled, moved)
        event = await client.body_event()
        if isinstance(event, h11.EndOfMessage):
            await upstream.send(event if trailers else h11.EndOfMessage())
            return
        await upstream.send(event)
        moved[0] += len(event.data)


class Exchanged:
    """What one exchange moved: the response's status and body bytes each way."""

    __slots__ = ("down", "status", "up")

    def __init__(self) -> None:
        self.status = 0
        self.up = 0
        self.down = 0


async def exchange(client: ClientSide, upstream: UpstreamSide, request: h11.Request,
                   moved: Exchanged | None = None, *, trailers: bool = True) -> None:
    """Send ``request`` upstream, relay its body and the response back.

    Raises HttpError for what the client should be told (while it still can be).
    ``moved``, when given, gets the status and the body bytes each way (for
    the record), also when the exchange fails part way.
    """
    up, down = [0], [0]
    await upstream.send(request)
    body = asyncio.create_task(_pump_request_body(client, upstream, up, trailers))
    try:
        status = await _relay_response_head(client, upstream, body)
        withheld = status < 0
        if moved is not None:
            moved.status = abs(status)
        stalled = HttpError(504, "the upstream did not answer in time")
        chunk_pumps = True  # until one moves too little to be worth its threads
        while True:
            # Then the ordinary step below reads the end of the body, or what cut it short.
            if bulk_left(upstream.conn, client.conn, upstream.stream, client.stream):
                await _race(move(upstream.conn, client.conn, upstream.stream, client.stream,
                                 upstream.timeout, stalled, down), body)
            elif chunk_pumps and (scan := chunked_ready(
                    upstream.conn, client.conn, upstream.stream, client.stream, down[0])) and (
                    upstream.nothing_held()):
                chunk_pumps = await _race(move_chunked(
                    upstream.conn, upstream.stream, client.stream, scan, upstream.timeout,
                    stalled, down), body)
            event = await _race(upstream.next_event(), body)
            if isinstance(event, h11.Data):
                down[0] += len(event.data)
                await client.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await client.send(h11.EndOfMessage())
                break
            else:
                raise ConnectionResetError("the upstream ended the response early")
        if withheld:
            return  # the client was told the connection closes; it sends no body
        # The response is whole.  The client may still be sending (an early 4xx):
        # give it its idle time.  A body that then fails only means the
        # connection cannot carry another request (h11's states say so), not
        # that this exchange failed.
        with contextlib.suppress(HttpError, OSError, TimeoutError, h11.LocalProtocolError):
            await asyncio.wait_for(asyncio.shield(body), client.limits.idle_timeout)
    finally:
        if not body.done():
            body.cancel()
            with contextlib.suppress(BaseException):
                await body
        if moved is not None:
            moved.up, moved.down = up[0], down[0]


async def _relay_response_head(client: ClientSide, upstream: UpstreamSide,
                               body: asyncio.Task[None]) -> int:
    """Relay the upstream's 100s and final head; its status, negative if the body was withheld.

    Only the upstream says ``100 Continue``: the proxy never does, so a client
    that expects it sends its body only when the upstream wants it.
    """
    while True:
        event = await _race(upstream.next_event(), body)
        if isinstance(event, h11.InformationalResponse):
            if event.status_code == 100:
                await client.send(event)
            continue
        if isinstance(event, h11.Response):
            break
        if isinstance(event, h11.ConnectionClosed):
            raise HttpError(502, "the upstream closed without a response")
        raise HttpError(502, "the upstream sent no response")
    headers = forward_headers(list(event.headers), drop_auth=False)
    # A final status while the client still waits for 100 (a refused
    # expectation): it will not send the body it announced, so the connection
    # must end with this response, else its next request would be read as that
    # body (RFC 9110 10.1.1).  h11 forgets the wait once the response is sent.
    withheld = client.conn.they_are_waiting_for_100_continue
    if withheld:
        headers.append((b"Connection", b"close"))
    await client.send(h11.Response(status_code=event.status_code, headers=headers,
                                   reason=event.reason))
    return -event.status_code if withheld else event.status_code


async def _race(step: Coroutine[Any, Any, _T], body: asyncio.Task[None]) -> _T:
    """Await ``step`` while surfacing a failure of the body pump at once."""
    if body.done():
        # The usual case once a request is sent whole: no second task needed.
        body.result()
        return await step
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({task, body}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled (the proxy's shutdown): the step ends with it
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    if task in done:
        return task.result()
    try:
        body.result()
    except BaseException:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    return await task
