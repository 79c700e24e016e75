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
from chunk_differential import SCANNED, reference, through_pumps

from libegress.chunks import FOOTER, FRAMING, ChunkScan, framed, framed_into

POOL = bytes(random.Random(3).choice(b"ab\r\n0") for _ in range(1 << 17))  # chunk data


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


@pytest.mark.parametrize("sizes", [[1], [2, 3], [16384] * 16, [1] * 40, [0, 7, 0],
                                   [(1 << 18) + 18]])
def test_framed_into_a_reused_buffer_as_h11_frames(sizes: list[int]) -> None:
    """Into a buffer with exactly the room (header, data, footer), one byte less, one more,
    and FRAMING more; a pump reuses it step after step (stale bytes from the last)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    conn.next_event()
    conn.send(h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")]))
    rng = random.Random(len(sizes))
    buf = bytearray()
    spans: list[tuple[int, int]] = []
    for size in sizes:
        buf += b"\r\nff\r\n"  # framing between the spans: not copied
        spans.append((len(buf), len(buf) + size))
        buf += rng.randbytes(size)
    data = sum(sizes)
    expected = conn.send(h11.Data(data=b"".join(buf[a:b] for a, b in spans)))
    assert expected is not None and bytes(framed(buf, spans)) == expected
    exact = len(b"%x" % data) + 2 + data + len(FOOTER)
    for room in (exact - 1, exact, exact + 1, data + FRAMING):
        out = memoryview(bytearray(b"\xee" * room))
        if room < exact:
            with pytest.raises(ValueError):
                framed_into(out, buf, spans)
            continue
        assert framed_into(out, buf, spans) == (exact, data)
        assert bytes(out[:exact]) == expected
        assert framed_into(out, memoryview(buf), spans) == (exact, data)  # again, over it
        assert bytes(out[:exact]) == expected


def test_framed_into_refuses_an_empty_chunk() -> None:
    out = memoryview(bytearray(64))
    for spans in ([], [(3, 3)], [(0, 0), (5, 5)]):
        with pytest.raises(ValueError):
            framed_into(out, b"abcdef", spans)
        with pytest.raises(ValueError):
            framed(b"abcdef", spans)
