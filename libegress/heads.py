"""Request-head rules the proxy adds on top of h11, and the reading of requests (pure).

h11 parses every head; it is also lenient where a proxy must not be: it unfolds
obsolete line folding, merges identical duplicate Content-Length headers and
lets Transfer-Encoding win over Content-Length.  A proxy forwarding such a head
to a server that reads it differently is how requests get smuggled, so those
heads are refused here, from the raw bytes h11 has already accepted, before the
request goes anywhere.

:class:`RequestReader` is a client connection's request side without I/O: the
head gate (limits and screening, on head bytes only) in front of h11, which
frames the body.  The functions that rewrite headers for the upstream live here
too.
"""

from __future__ import annotations

import base64
import re

import h11

from libegress.hosts import BadHost, parse_authority
from libegress.limits import Limits

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 hop-by-hop fields, plus the proxy's own.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
     b"transfer-encoding", b"upgrade"}
)
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class HttpError(Exception):
    """A request answered by the proxy itself with ``status``."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def head_end(buffer: bytes | bytearray | memoryview) -> int | None:
    """Where the head in ``buffer`` ends (after its blank line), or None."""
    match = _HEAD_END.search(buffer)
    return match.end() if match else None


def request_head(buffer: bytes | bytearray, limits: Limits) -> int | None:
    """The size of the request head that starts ``buffer``; None while it is incomplete.

    Only head bytes count against the limits.  What follows the head in the
    same reads (its body, a pipelined request) is never looked at: counting it
    made a request's fate depend on how its bytes happened to arrive.  Raises
    HttpError: 431 for a head or request line over its limit, 400 for a
    smuggling shape.
    """
    # A head ending past max_head is refused either way, so no byte beyond it is
    # searched, however much body came along.
    window = memoryview(buffer)[: limits.max_head]
    end = head_end(window)
    line_end = bytes(window[: limits.max_request_line + 1]).find(b"\n")
    line = len(window) if line_end < 0 else line_end
    if line > limits.max_request_line:
        raise HttpError(431, "request line too long")
    if end is None:
        if len(buffer) > limits.max_head:
            raise HttpError(431, "request head too large")
        return None
    reason = smuggling_reason(bytes(window[:end]))
    if reason is not None:
        raise HttpError(400, f"refused: {reason}")
    return end


class RequestReader:
    """A client connection's requests, sans I/O: bytes in, h11 events out.

    Until a request's head is whole its bytes wait here, where they alone are
    held to the head limits and screened; then they go to a fresh h11 server
    connection together with whatever followed them (body bytes, a pipelined
    request), and h11 frames the body.  ``conn`` is also the writer of the
    responses, so that h11 keeps both directions' states.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.conn = self._fresh()
        self._pending = bytearray()
        self._closed = False
        self._gated = True

    def _fresh(self) -> h11.Connection:
        # h11's own bound applies to what it must see whole after the head:
        # chunk-size lines and trailers.
        return h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head)

    @property
    def in_head(self) -> bool:
        """Whether part of a request head is waiting (its deadline runs)."""
        return self._gated and bool(self._pending)

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the client; b"" is the end of its stream."""
        if not self._gated:
            self.conn.receive_data(data)
        elif data:
            self._pending += data
        else:
            self._closed = True

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """The next request event, NEED_DATA or PAUSED; HttpError for a refusal.

        A stream ending between requests (or inside blank lines) gives
        ConnectionClosed.
        """
        if self._gated and not self._open_gate():
            if not self._closed:
                return h11.NEED_DATA
            if self._pending.strip():
                raise HttpError(400, "the connection ended inside a request head")
            return h11.ConnectionClosed()
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpError(exc.error_status_hint, f"bad request: {exc}") from None

    def _open_gate(self) -> bool:
        end = request_head(self._pending, self.limits)
        if end is None:
            return False
        self.conn.receive_data(bytes(self._pending))
        if self._closed:
            self.conn.receive_data(b"")
        self._pending = bytearray()
        self._gated = False
        return True

    def next_cycle(self) -> bool:
        """Carry unread bytes over to the next request; False if none may follow."""
        if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
            return False
        data, closed = self.conn.trailing_data
        self.conn = self._fresh()
        self._pending = bytearray(data)
        self._closed = closed
        self._gated = True
        return not closed

    def switched_data(self) -> bytes:
        """Bytes the client sent after its CONNECT head (a TLS hello, say)."""
        return self.conn.trailing_data[0]


def smuggling_reason(head: bytes) -> str | None:
    """Why a raw request head is refused, or None when it is acceptable."""
    if b"\n" in head.replace(b"\r\n", b""):
        return "bare LF line ending in the request head"
    lines = head.split(b"\r\n")[1:]
    content_lengths = 0
    transfer_encodings = 0
    for line in lines:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            return "obsolete line folding in the request head"
        name = line.split(b":", 1)[0].lower()
        if name != name.strip():
            return "whitespace around a header name"
        if name == b"content-length":
            content_lengths += 1
            if b"," in line:
                return "a list in Content-Length"
        elif name == b"transfer-encoding":
            transfer_encodings += 1
    if content_lengths > 1:
        return "duplicate Content-Length headers"
    if content_lengths and transfer_encodings:
        return "both Content-Length and Transfer-Encoding"
    return None


def connection_tokens(headers: Headers) -> set[bytes]:
    """Field names listed in Connection (also hop-by-hop)."""
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return names


def forward_headers(headers: Headers, *, drop_auth: bool) -> Headers:
    """``headers`` without hop-by-hop fields (and credentials when asked).

    Framing (Content-Length or chunked) is kept as one field h11 re-applies.
    """
    listed = connection_tokens(headers)
    out: Headers = []
    chunked = False
    for name, value in headers:
        low = name.lower()
        if low == b"transfer-encoding":
            chunked = True
            continue
        if low in HOP_BY_HOP or low in listed or low.startswith(b"proxy-"):
            continue
        if drop_auth and low == b"authorization":
            continue
        out.append((name, value))
    if chunked:
        out.append((b"Transfer-Encoding", b"chunked"))
    return out


def authorization(host: str, token: str) -> bytes:
    """The header value the token goes to ``host`` with.

    git's endpoint on github.com takes Basic only; the API hosts take Bearer.
    """
    if host == "github.com":
        pair = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        return f"Basic {pair}".encode()
    return f"Bearer {token}".encode()


def host_header(headers: Headers) -> bytes | None:
    """The request's Host value; None when absent or given more than once."""
    values = [v for n, v in headers if n.lower() == b"host"]
    return values[0] if len(values) == 1 else None


def same_host(value: bytes, host: str, port: int) -> bool:
    """Whether a Host value names ``host`` (on ``port``, or the default)."""
    try:
        named, named_port = parse_authority(value.decode("ascii"), default_port=port)
    except (BadHost, UnicodeDecodeError):
        return False
    return named == host and named_port == port
