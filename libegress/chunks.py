"""Chunked transfer-coding, read as h11 reads it, for the chunks a pump may take.

A chunked body on the inject path went through h11 one chunk at a time
(0.15-0.25x of a direct transfer).  A pump (:mod:`libegress.tls_pump`) moves
it in a thread instead, and needs the chunk framing read outside h11.  Two
readers of one framing are how requests get smuggled, so this one reads
*less* than h11, never differently:

- it takes only chunk headers of the plainest form, 1 to 16 hex digits and
  CRLF (``4000\\r\\n``), and the CRLF after each chunk's data;
- it stops at anything else and leaves it, unread, to h11: the last chunk
  (size 0, then trailers), a chunk extension, whitespace, more digits, a bare
  LF, bad hex, a footer that is not CRLF, a header longer than HEADER_MAX
  without its CRLF.  h11 then reads it as it would have, and accepts it or
  refuses it with its own words.

:class:`ChunkScan` carries exactly h11's ``ChunkedReader`` state (bytes left
in the chunk, footer bytes still expected), so that a pump starts from h11's
state and hands h11 back its state and the bytes not read.  Where it reads,
h11 would read the same data bytes and reach the same state; the
differential test (tests/egress/test_egress_chunks.py) holds the two equal
over generated and hostile inputs.  Pure: no I/O.
"""

from __future__ import annotations

import re

HEADER_MAX = 18  # the longest header taken: 16 hex digits and CRLF
_HEADER = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")
_PARTIAL = re.compile(rb"[0-9A-Fa-f]{0,16}\r?")  # a beginning of one, not yet whole
FOOTER = b"\r\n"
FRAMING = HEADER_MAX + len(FOOTER)  # the most a chunk's framing adds to its data


class ChunkScan:
    """h11's chunked-body state, advanced over plaintext while it holds no doubt."""

    __slots__ = ("in_chunk", "stopped", "to_discard")

    def __init__(self, in_chunk: int = 0, to_discard: bytes = b"") -> None:
        if in_chunk < 0 or not FOOTER.endswith(to_discard) or (in_chunk and to_discard):
            raise ValueError("not a state h11 can be in")
        self.in_chunk = in_chunk  # data bytes left in this chunk
        self.to_discard = to_discard  # what is left of its CRLF footer
        self.stopped = False  # it met something only h11 reads: nothing more is taken

    def scan(self, buf: bytes | bytearray | memoryview, start: int, end: int,
             spans: list[tuple[int, int]]) -> int:
        """Read ``buf[start:end]``; the data's (begin, end) offsets onto ``spans``.

        Returns the offset of the first byte not read.  Short of ``end`` it is
        either a chunk header not yet whole (at most HEADER_MAX - 1 bytes:
        give them again, with what follows, to the next call), or, once
        ``stopped``, the first byte that is h11's to read.
        """
        pos = start
        view = memoryview(buf)
        while pos < end and not self.stopped:
            if self.to_discard:
                take = min(len(self.to_discard), end - pos)
                if view[pos:pos + take] != self.to_discard[:take]:
                    self.stopped = True  # h11: "malformed chunk footer"
                    break
                self.to_discard = self.to_discard[take:]
                pos += take
            elif self.in_chunk:
                take = min(self.in_chunk, end - pos)
                spans.append((pos, pos + take))
                self.in_chunk -= take
                pos += take
                if not self.in_chunk:
                    self.to_discard = FOOTER
            else:
                after = self._header(buf, pos, end)
                if after is None:
                    break  # not whole yet
                pos = after
        return pos

    def _header(self, buf: bytes | bytearray | memoryview, pos: int, end: int) -> int | None:
        """The offset after a plain header at ``pos`` (``pos`` itself if it is h11's to
        read); None while it is not whole yet."""
        match = _HEADER.match(buf, pos, end)
        if match is None:
            if end - pos < HEADER_MAX and _PARTIAL.fullmatch(buf, pos, end):
                return None
            self.stopped = True  # not ours (or overlong): h11 reads it
            return pos
        size = int(match[1], 16)
        if not size:
            self.stopped = True  # the last chunk: h11 reads it and the trailers
            return pos
        self.in_chunk = size
        return match.end()


def framed(buf: bytes | bytearray | memoryview, spans: list[tuple[int, int]]) -> bytearray:
    """The data of ``spans`` as one chunk, framed as h11's ChunkedWriter frames one."""
    out = bytearray(sum(stop - begin for begin, stop in spans) + FRAMING)
    written, _ = framed_into(memoryview(out), buf, spans)
    del out[written:]
    return out


def framed_into(out: memoryview, buf: bytes | bytearray | memoryview,
                spans: list[tuple[int, int]]) -> tuple[int, int]:
    """:func:`framed` into ``out`` (room for the data and FRAMING); (bytes written, data bytes).

    A pump's chunk goes into a buffer it reuses: no fresh object per step.
    """
    size = sum(stop - begin for begin, stop in spans)
    if size <= 0:
        raise ValueError("an empty chunk is the body's end")
    header = b"%x\r\n" % size
    if len(out) < size + len(header) + len(FOOTER):
        raise ValueError("no room for the chunk")
    pos = len(header)
    out[:pos] = header
    view = memoryview(buf)
    for begin, stop in spans:
        out[pos:pos + stop - begin] = view[begin:stop]
        pos += stop - begin
    out[pos:pos + len(FOOTER)] = FOOTER
    return pos + len(FOOTER), size
