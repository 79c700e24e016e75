"""The chunked-body reader a pump uses (libegress.chunks), held equal to h11's.

Differential: each input is a chunked body (generated, mutated, or written
by hand to be hostile), fed in pieces to h11 alone (the reference) and to the
way a pump reads it: h11 until a pump may start (chunk_state), then
ChunkScan over the following pieces, then back to h11 (chunk_restore) with
the bytes it did not read, possibly several times.  Both must give the same
body bytes and end the same way: the same end of message and trailers, the
same refusal in h11's own words, or, still waiting, the same h11 state and
buffer.  No I/O: thousands of inputs in about a second.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import h11
import pytest

from libegress.bulk_body import chunk_restore, chunk_state
from libegress.chunks import HEADER_MAX, ChunkScan, framed

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
POOL = bytes(random.Random(3).choice(b"ab\r\n0") for _ in range(1 << 17))  # chunk data
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


def body(rng: random.Random) -> bytes:
    """A chunked body, mostly well formed, in the forms servers send."""
    out = bytearray()
    for _ in range(rng.choice([0, 1, 2, 5, 20])):
        size = rng.choice([1, 2, 15, 16, 17, 255, 4096, 16384, rng.randrange(1, 70000)])
        at = rng.randrange(len(POOL) - size)
        digits = b"%x" % size
        if rng.random() < 0.3:
            digits = digits.upper()
        if rng.random() < 0.1:
            digits = b"0" * rng.choice([1, 5, 16 - len(digits), 20 - len(digits)]) + digits
        ext = rng.choice([b""] * 8 + [b";a=b", b"; x", b";\r", b" ", b"\t"])
        data = POOL[at:at + size]
        out += digits + ext + b"\r\n" + data + b"\r\n"
    out += rng.choice([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"000\r\n\r\n", b"0;e\r\n\r\n",
                       b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n", b""])
    return bytes(out)


HOSTILE = [b"0x10\r\n", b"+10\r\n", b"-1\r\n", b" 10\r\n", b"10 \r\n", b"10\t\r\n", b"10\n",
           b"10\r\r\n", b"10\r", b"\r\n", b"\n", b"g\r\n", b"1_0\r\n", b"10;\n",
           b"f" * 16 + b"\r\n", b"f" * 17 + b"\r\n", b"1" * 20 + b"\r\n", b"1" * 21 + b"\r\n",
           b"0" * 40 + b"1\r\n", b"10" + b" " * 40 + b"\r\n", b"1\r\nab\r\n",
           b"5\r\nhelloXX", b"5\r\nhello\n", b"5\r\nhello\r\r\n", b"5\r\nhello\rX",
           b"5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n", b"5\r\nhello\r\n0\r\nX: 1\r\n",
           b"5\r\nhello\r\n0\r\n\n", b"5\r\nhel", b"3;" + b"x" * 20000 + b"\r\nabc\r\n0\r\n\r\n",
           b"3" + b"x" * 20000, b"\x00\r\n", b"\xff\r\n", b"4\r\n\r\n\r\n\r\n0\r\n\r\n"]
NOISE = [b"\r", b"\n", b"\r\n", b"0", b"f", b"F", b"g", b";", b" ", b"\t", b"\x00", b"-", b"x"]


def mutated(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4])):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(4)
        if kind == 0 and out:
            del out[min(at, len(out) - 1)]
        elif kind == 1 and out:
            out[min(at, len(out) - 1):min(at, len(out) - 1) + 1] = rng.choice(NOISE)
        elif kind == 2:
            out[at:at] = rng.choice(NOISE)
        else:
            del out[at:]
    return bytes(out)


def split(data: bytes, rng: random.Random) -> Iterator[list[bytes]]:
    """Pieces as reads give them: never empty (b"" is the end of the stream)."""
    yield [data] if data else []
    if len(data) < 300:
        yield [data[i:i + 1] for i in range(len(data))]
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.choice([1, 3, 10, 40])))
    yield [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if b > a]


def inputs() -> Iterator[bytes]:
    rng = random.Random(29)
    yield from HOSTILE
    for case in HOSTILE:  # after well-formed chunks, and after a pump could have started
        yield b"4\r\nabcd\r\n" + case
        yield b"4\r\nabcd\r\n10\r\n" + b"y" * 16 + b"\r\n" + case
    for _ in range(400):
        data = body(rng)
        yield data
        yield mutated(data, rng)
    for _ in range(300):
        alphabet = b"0123456789abcdefABCDEFgx\r\n; \t"
        yield bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))


def test_a_pump_reads_every_body_as_h11_does() -> None:
    rng = random.Random(7)
    count = 0
    for data in inputs():
        for pieces in split(data, rng):
            for eof in (False, True):
                expected = reference(pieces, eof)
                got = through_pumps(pieces, eof, rng)
                assert got == expected, (data[:200], [len(p) for p in pieces][:20], eof)
                count += 1
    assert count > 4000
    assert SCANNED[0] > 10_000_000


def test_what_it_leaves_to_h11() -> None:
    """The plain forms it reads; everything else, it stops before (h11 decides)."""
    for header in (b"1\r\n", b"0010\r\n", b"A\r\n", b"f" * 16 + b"\r\n"):
        scan = ChunkScan()
        assert scan.scan(header, 0, len(header), []) == len(header) and not scan.stopped
    for header in (b"0\r\n", b"000\r\n", b"1;x\r\n", b"1 \r\n", b"1\n", b"f" * 17 + b"\r\n",
                   b"x\r\n", b"1\r\r\n", b"\r\n"):
        scan = ChunkScan()
        assert scan.scan(header, 0, len(header), []) == 0 and scan.stopped, header
    scan = ChunkScan()
    assert scan.scan(b"ff\r", 0, 3, []) == 0 and not scan.stopped  # not whole yet
    scan = ChunkScan(2)
    spans: list[tuple[int, int]] = []
    assert scan.scan(b"abXY", 0, 4, spans) == 2 and scan.stopped and spans == [(0, 2)]
    for bad in ((-1, b""), (1, b"\r\n"), (0, b"x"), (0, b"\n\r")):
        with pytest.raises(ValueError):
            ChunkScan(*bad)


def test_framed_as_h11_frames() -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    conn.next_event()
    conn.send(h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")]))
    buf = b"..abc...defg"
    assert bytes(framed(buf, [(2, 5), (8, 12)])) == conn.send(h11.Data(data=b"abcdefg"))
