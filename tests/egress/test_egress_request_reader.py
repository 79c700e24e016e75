"""The request side of a client connection, sans I/O (heads.RequestReader).

How the bytes of a connection are cut into reads must never change what the
proxy makes of them: the same requests, heads, bodies and trailers for every
split.  Tight limits keep the stream small enough to split at every byte
boundary while its bodies are still far larger than the head limit.
"""

from __future__ import annotations

from itertools import pairwise

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libegress.heads import HttpError, RequestReader, request_head
from libegress.http1 import GATHER, gathered
from libegress.limits import Limits

LIMITS = Limits(max_head=256, max_request_line=64)

# Body bytes that look like a head end and a request: only framing may decide.
TRICKY = b"\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: evil\r\n\r\n"
BODY_CL = (TRICKY + bytes(range(256))) * 3  # 1.1 KiB: over four times max_head
BODY_CHUNKS = [b"a" * 300, TRICKY, b"b" * 700]
STREAM = (
    b"POST /one HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(BODY_CL) + BODY_CL
    + b"POST /two HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in BODY_CHUNKS)
    + b"0\r\nX-Sum: abc\r\nX-Other: 1\r\n\r\n"
    + b"POST /three HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nxyz"
    + b"GET /four HTTP/1.1\r\nHost: h\r\n\r\n"
)

Seen = list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes, list[tuple[bytes, bytes]]]]


def read_all(pieces: list[bytes], limits: Limits = LIMITS) -> Seen:
    """Every request (method, target, headers, body, trailers) read from ``pieces``.

    Bytes are given one piece per NEED_DATA, as a socket would (never an empty
    one: that is the end of the stream); each request gets an empty 200 so the
    connection may carry the next.
    """
    reader = RequestReader(limits)
    feed = iter([p for p in pieces if p])
    seen: Seen = []
    while True:
        event = reader.next_event()
        if event is h11.NEED_DATA:
            reader.receive_data(next(feed, b""))
        elif isinstance(event, h11.Request):
            seen.append((event.method, event.target, list(event.headers), b"", []))
        elif isinstance(event, h11.Data):
            method, target, headers, body, trailers = seen[-1]
            seen[-1] = (method, target, headers, body + event.data, trailers)
        elif isinstance(event, h11.EndOfMessage):
            method, target, headers, body, _ = seen[-1]
            seen[-1] = (method, target, headers, body, list(event.headers))
            reader.conn.send(h11.Response(status_code=200, headers=[(b"Content-Length", b"0")]))
            reader.conn.send(h11.EndOfMessage())
            if not reader.next_cycle():
                return seen
        elif isinstance(event, h11.ConnectionClosed):
            return seen
        else:
            raise AssertionError(f"unexpected {event!r}")


WHOLE = read_all([STREAM])


def test_the_stream_reads_as_four_requests() -> None:
    assert [(m, t) for m, t, *_ in WHOLE] == [(b"POST", b"/one"), (b"POST", b"/two"),
                                                (b"POST", b"/three"), (b"GET", b"/four")]
    assert WHOLE[0][3] == BODY_CL
    assert WHOLE[1][3] == b"".join(BODY_CHUNKS)
    assert WHOLE[1][4] == [(b"x-sum", b"abc"), (b"x-other", b"1")]
    assert WHOLE[2][3] == b"xyz"


def test_every_split_point_gives_the_same_requests() -> None:
    for cut in range(len(STREAM) + 1):
        assert read_all([STREAM[:cut], STREAM[cut:]]) == WHOLE, cut


def test_byte_at_a_time_gives_the_same_requests() -> None:
    assert read_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == WHOLE


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_any_cuts_give_the_same_requests(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    assert read_all([STREAM[a:b] for a, b in pairwise(points)]) == WHOLE


def test_only_head_bytes_count_against_the_limit() -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4000\r\n\r\n"
    assert request_head(head + b"x" * 4000, LIMITS) == len(head)
    padded = head[:-2] + b"X-Pad: " + b"p" * (LIMITS.max_head - len(head) - 9) + b"\r\n\r\n"
    assert len(padded) == LIMITS.max_head
    assert request_head(padded + b"x" * 4000, LIMITS) == LIMITS.max_head
    with pytest.raises(HttpError, match="head too large") as over:
        request_head(padded[:-4] + b"p\r\n\r\n" + b"x" * 4000, LIMITS)
    assert over.value.status == 431
    assert request_head(padded[:100], LIMITS) is None


@pytest.mark.parametrize(
    ("data", "status", "why"),
    [
        (b"GET /" + b"a" * 64 + b" HTTP/1.1\r\n", 431, "request line too long"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 300, 431, "request head too large"),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400,
         "duplicate"),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
         "both"),
    ],
)
def test_refusals(data: bytes, status: int, why: str) -> None:
    with pytest.raises(HttpError, match=why) as refused:
        read_all([data])
    assert refused.value.status == status


def test_a_stream_ending_inside_a_head_is_refused() -> None:
    with pytest.raises(HttpError, match="inside a request head"):
        read_all([b"GET / HTTP/1.1\r\nHost"])
    assert read_all([b"\r\n"]) == []


# -- http1.gathered: a chunked body's pieces joined, what stopped them kept --------------


def _chunked_server(chunks: list[bytes], tail: bytes) -> h11.Connection:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + tail)
    assert isinstance(conn.next_event(), h11.Request)
    return conn


def _parsed(conn: h11.Connection) -> object:
    try:
        return conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise HttpError(400, str(exc)) from None


@pytest.mark.parametrize("count", [1, 2, 16, 40])
def test_gathered_joins_the_chunks_ready_and_keeps_the_end(count: int) -> None:
    chunks = [bytes([65 + i % 26]) * (16 * 1024 - i) for i in range(count)]
    conn = _chunked_server(chunks, b"0\r\nX-T: 1\r\n\r\n")
    got = bytearray()
    held = None
    while held is None:
        first = _parsed(conn)
        assert isinstance(first, h11.Data)
        piece, held = gathered(first, lambda: _parsed(conn))
        assert len(piece.data) <= GATHER + 16 * 1024
        got += piece.data
    assert bytes(got) == b"".join(chunks)
    assert isinstance(held, h11.EndOfMessage) and held.headers == [(b"x-t", b"1")]


def test_gathered_gives_the_bytes_before_a_bad_chunk_then_its_error() -> None:
    conn = _chunked_server([b"a" * 10, b"b" * 20], b"zz\r\n")
    first = _parsed(conn)
    assert isinstance(first, h11.Data)
    piece, held = gathered(first, lambda: _parsed(conn))
    assert piece.data == b"a" * 10 + b"b" * 20
    assert isinstance(held, HttpError)


def test_gathered_stops_where_h11_needs_data() -> None:
    conn = _chunked_server([b"a" * 10], b"5\r\nbb")
    first = _parsed(conn)
    assert isinstance(first, h11.Data)
    piece, held = gathered(first, lambda: _parsed(conn))
    assert piece.data == b"a" * 10 + b"bb" and held is None
