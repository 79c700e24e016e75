"""Large Content-Length bodies between two TLS streams: moved by a pump, framed by h11.

On the inject path every body byte is decrypted from one side and encrypted
for the other.  A body of at least BULK bytes goes through a
:class:`~libegress.tls_pump.Pump` (a thread, both cores) when all of this holds:

- both ends are TLS streams (the inject path's two);
- h11 frames it with Content-Length on both sides, with the same count left
  (the request as read from the client and as sent upstream; the response as
  read from the upstream and as sent to the client);
- h11 holds none of its bytes unread, and no read of the source is under way.

The pump moves exactly the count h11 says is left, then h11 is told those
bytes went.  h11 has no public call for body bytes it did not see, so this
module is the one place that touches its readers' and writers' counts, after
checking their types; anything else and the body goes the ordinary way, one
read at a time through h11.  Heads, the judgement of each request, the token,
trailers, the end of each message and keep-alive stay with h11 and
:mod:`libegress.http1`: a pump only ever moves bytes h11 has already framed
as this body's, so the next request on the connection is parsed, judged and
injected as ever.

A chunked body, once BULK of it went the ordinary way, goes through a
:class:`~libegress.tls_pump.ChunkedPump` from h11's own state inside the
chunks (:func:`chunk_state`), and h11 gets back the state the pump reached
and the bytes it decrypted but did not read (:func:`chunk_restore`): the
last chunk, and anything :mod:`libegress.chunks` leaves to h11.  This module
is also the one place that touches h11's ChunkedReader.

A body cut short (the source ends) leaves the pump early with what it moved,
counted in h11, and the ordinary path then reads the end and refuses or fails
exactly as it would have.  A source silent for the timeout gets the ordinary
path's answer (``stalled``).
"""

from __future__ import annotations

import h11
from h11._readers import ChunkedReader, ContentLengthReader
from h11._writers import ChunkedWriter, ContentLengthWriter

from libegress.chunks import ChunkScan
from libegress.heads import HttpError
from libegress.streams import Stream, TlsStream
from libegress.tls_pump import ChunkedPump, Pump, Stalled

BULK = 256 * 1024  # the least body left that goes through a pump
# Pumps at once in the process (two per connection at most); past this, bodies
# go the ordinary way rather than start more threads.
MAX_PUMPS = 64
_running = [0]  # pumps now (touched on the event loop's thread only)


def bulk_left(source: h11.Connection, sink: h11.Connection, src: Stream, dst: Stream) -> int:
    """Body bytes a pump may move now from ``src`` (read through ``source``) to ``dst``.

    0: this step goes the ordinary way.  When only a read under way stands in
    the pump's way, ``src`` starts no further read ahead, so that the next
    ordinary step takes that read and leaves the stream to a pump.
    """
    if not isinstance(src, TlsStream) or not isinstance(dst, TlsStream):
        return 0
    if _running[0] >= MAX_PUMPS:
        return 0
    if source.their_state is not h11.SEND_BODY or sink.our_state is not h11.SEND_BODY:
        return 0
    reader, writer = source._reader, sink._writer
    if type(reader) is not ContentLengthReader or type(writer) is not ContentLengthWriter:
        return 0
    left = reader._remaining
    if left < BULK or writer._length != left:
        return 0
    if source._receive_buffer or source._receive_buffer_closed:
        return 0
    if not src.reads_idle():
        src.read_ahead = False
        return 0
    return left


async def move(source: h11.Connection, sink: h11.Connection, src: Stream, dst: Stream,
               timeout: float, stalled: HttpError, tally: list[int]) -> None:
    """Pump what :func:`bulk_left` allowed, counted in both h11 connections and ``tally[0]``.

    ``stalled`` is raised when ``src`` sends nothing for ``timeout`` seconds.
    """
    reader, writer = source._reader, sink._writer
    if (not isinstance(src, TlsStream) or not isinstance(dst, TlsStream)
            or type(reader) is not ContentLengthReader
            or type(writer) is not ContentLengthWriter):
        raise TypeError("move() without bulk_left()")
    pump = Pump(src, dst, reader._remaining, timeout)
    try:
        await _pumped(pump, src, dst, stalled)
    finally:
        reader._remaining -= pump.moved
        writer._length -= pump.moved
        tally[0] += pump.moved
        src.read_ahead = True


async def _pumped(pump: Pump, src: TlsStream, dst: TlsStream, stalled: HttpError) -> None:
    """Run ``pump`` holding the source's reads and the sink's writes (no task touches
    those directions meanwhile), counted among the pumps running."""
    _running[0] += 1
    try:
        async with src.raw.recv_lock, dst.raw.send_lock:
            await pump.run()
    except Stalled:
        raise stalled from None
    finally:
        _running[0] -= 1


def chunked_ready(source: h11.Connection, sink: h11.Connection, src: Stream, dst: Stream,
                  so_far: int) -> ChunkScan | None:
    """Where a pump may take up a chunked body now from ``src`` to ``dst``; None: not now.

    Only once ``so_far`` (the body's bytes already moved) reaches BULK: a
    small body costs no threads.  The sink must write chunked too (h11's
    ChunkedWriter, which keeps no state of its own), and h11 must be between
    reads inside the chunks (:func:`chunk_state`).
    """
    if not isinstance(src, TlsStream) or not isinstance(dst, TlsStream):
        return None
    if so_far < BULK or _running[0] >= MAX_PUMPS:
        return None
    if sink.our_state is not h11.SEND_BODY or type(sink._writer) is not ChunkedWriter:
        return None
    scan = chunk_state(source)
    if scan is None:
        return None
    if not src.reads_idle():
        src.read_ahead = False
        return None
    return scan


async def move_chunked(source: h11.Connection, src: Stream, dst: Stream, scan: ChunkScan,
                       timeout: float, stalled: HttpError, tally: list[int]) -> bool:
    """Pump the chunks :func:`chunked_ready` allowed; h11 then reads on from where it stopped.

    Whether another pump is worth its threads for this body: not when this
    one moved less than BULK (a sender whose every chunk h11 must read, say).
    """
    if not isinstance(src, TlsStream) or not isinstance(dst, TlsStream):
        raise TypeError("move_chunked() without chunked_ready()")
    pump = ChunkedPump(src, dst, scan, timeout)
    try:
        await _pumped(pump, src, dst, stalled)
    finally:
        chunk_restore(source, pump.scan, pump.rest)
        tally[0] += pump.moved
        src.read_ahead = True
    return pump.moved >= BULK


def chunk_state(source: h11.Connection) -> ChunkScan | None:
    """h11's state inside a chunked body, for a pump to go on from; None if there is none.

    None also when h11 holds bytes unread (a pump starts with an empty
    buffer), reads the trailers, or keeps its state in another form (h11
    before 0.16 kept the footer as a count and never checked it).
    """
    reader = source._reader
    if source.their_state is not h11.SEND_BODY or type(reader) is not ChunkedReader:
        return None
    if reader._reading_trailer or type(reader._bytes_to_discard) is not bytes:
        return None
    if source._receive_buffer or source._receive_buffer_closed:
        return None
    try:
        return ChunkScan(reader._bytes_in_chunk, reader._bytes_to_discard)
    except ValueError:
        return None


def chunk_restore(source: h11.Connection, scan: ChunkScan, rest: bytes) -> None:
    """Hand h11 back the body: the state ``scan`` reached, then the bytes it did not read."""
    reader = source._reader
    if type(reader) is not ChunkedReader:
        raise TypeError("chunk_restore() without chunk_state()")
    reader._bytes_in_chunk = scan.in_chunk
    reader._bytes_to_discard = scan.to_discard
    if rest:
        source.receive_data(rest)
