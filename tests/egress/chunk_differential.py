"""The chunked-body differential: h11 alone against h11 with pumps' ChunkScan between.

Each input is a chunked body in pieces (reads), fed to h11 alone (the
reference, :func:`reference`) and as a pump reads it (:func:`through_pumps`):
h11 until a pump may start (``chunk_state``), then ChunkScan over the
following pieces, then back to h11 (``chunk_restore``) with the bytes it did
not read, possibly several times.  Both must give the same body bytes and end
the same way.  One harness for the test (tests/egress/test_egress_chunks.py)
and the stress fuzz target (bench/stress/fuzz_targets.py: ``chunks``).
"""

from __future__ import annotations

import random

import h11

from libegress.bulk_body import chunk_restore, chunk_state
from libegress.chunks import HEADER_MAX, ChunkScan

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
SCANNED = [0]  # body bytes ChunkScan read, over the test
Outcome = tuple[bytes, str]


def fresh() -> h11.Connection:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "t")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(HEAD)
    assert isinstance(conn.next_event(), h11.Response)
    return conn


def drain(conn: h11.Connection, data: bytearray) -> str | None:
    """Events until h11 needs data: the end ("eom ..." or "error ..."), else None."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            return f"error {exc}"
        if event is h11.NEED_DATA:
            return None
        if isinstance(event, h11.Data):
            data += event.data
        elif isinstance(event, h11.EndOfMessage):
            return f"eom {event.headers!r}"
        else:
            return f"other {event!r}"


def waiting(conn: h11.Connection) -> str:
    reader = conn._reader
    return (f"waiting {reader._bytes_in_chunk} {reader._bytes_to_discard!r} "
            f"{reader._reading_trailer} {bytes(conn._receive_buffer)!r}")


def reference(pieces: list[bytes], eof: bool) -> Outcome:
    conn, data = fresh(), bytearray()
    for piece in [*pieces, b""] if eof else pieces:
        conn.receive_data(piece)
        if (end := drain(conn, data)) is not None:
            return bytes(data), end
    return bytes(data), waiting(conn)


def through_pumps(pieces: list[bytes], eof: bool, rng: random.Random) -> Outcome:
    """As a pump reads: ChunkScan whenever chunk_state allows (and the dice say so)."""
    conn, data = fresh(), bytearray()
    scan: ChunkScan | None = None
    carry = b""
    for piece in pieces:
        if scan is None and rng.random() < 0.7:
            scan = chunk_state(conn)  # None unless h11 is between reads, inside the chunks
        if scan is None:
            conn.receive_data(piece)
            if (end := drain(conn, data)) is not None:
                return bytes(data), end
            continue
        buf = carry + piece
        spans: list[tuple[int, int]] = []
        pos = scan.scan(buf, 0, len(buf), spans)
        for begin, stop in spans:
            data += buf[begin:stop]
            SCANNED[0] += stop - begin
        carry = buf[pos:]
        assert scan.stopped or len(carry) < HEADER_MAX
        if scan.stopped or rng.random() < 0.1:  # a pump ends: h11 reads on
            chunk_restore(conn, scan, carry)
            scan, carry = None, b""
            if (end := drain(conn, data)) is not None:
                return bytes(data), end
    if scan is not None:
        chunk_restore(conn, scan, carry)
        if (end := drain(conn, data)) is not None:
            return bytes(data), end
    if eof:
        conn.receive_data(b"")
        if (end := drain(conn, data)) is not None:
            return bytes(data), end
    return bytes(data), waiting(conn)
