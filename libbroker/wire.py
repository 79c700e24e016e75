"""The broker wire format (docs/DESIGN.md 2.2) as pure functions: bytes in, frames out.

Nothing here touches a socket.  Every end decodes through :class:`Reader`
(broker-server's connection, broker-client, gpg-shim's Python path; the
fuzzer and the tests through :class:`FrameDecoder`, a thin wrapper); they
build outgoing bytes with the ``encode_*`` helpers.  Request validation lives
here too, so that the one place deciding what a request may contain is small
enough to read in full.

A frame is ``channel (1 byte) · length (4 bytes, big-endian, unsigned) ·
payload``.  A payload is at most :data:`MAX_PAYLOAD` bytes: a peer announcing
more is refused before a byte of it is buffered, so a hostile length cannot
make the other side allocate.

The reader does no I/O, in h11's way: it says how many bytes it wants next
(:meth:`Reader.want`, never past the current frame), takes what the caller
read (:meth:`Reader.feed`) and hands out events (:meth:`Reader.next_event`).
For a *passthrough* channel it announces the payload instead of buffering it
(:class:`Payload`): the caller may move those bytes itself, socket to pipe
with ``splice``, and say how many it moved (:meth:`Reader.passed`), or feed
them and get :class:`Data` chunks back.  That is how 1 GiB streams cross the
broker without passing through Python while one decoder still checks every
header.

Cheap to import, because gpg-shim's signing path (once per signature git
asks for) and broker-client (once per call) import it: plain int constants,
tuple subclasses for events, only C modules (``_json``) and
:mod:`libbroker.errors`; no enum, typing, struct or mmap.  The C fast path
(native/gpg_shim.c) keeps its own decoder, held equal to this one by
tests/signing/test_gpg_native.py.
"""

from __future__ import annotations

# The json package's own C string escaper (ASCII only; quotes, backslashes
# and control characters escaped): the client encodes its request by hand
# with it, since importing json (and re with it) costs every call.
from _json import encode_basestring_ascii as _json_string

from libbroker.errors import ProtocolError, RequestRefused

MAX_PAYLOAD = 1 << 20
"""The largest payload either side accepts (1 MiB)."""

HEADER_SIZE = 5


class Channel:
    """The channel byte of a frame: plain ints (an enum costs every client start)."""

    STDIN = 0
    STDOUT = 1
    STDERR = 2
    EXIT = 3
    ERROR = 4
    REQUEST = 5
    SIGNAL = 6


CHANNEL_NAMES = ("stdin", "stdout", "stderr", "exit", "error", "request", "signal")
"""Each channel's name, indexed by its number (for messages)."""

CLIENT_CHANNELS = frozenset({Channel.STDIN, Channel.REQUEST, Channel.SIGNAL})
"""Channels a client may send (what the server accepts)."""

SERVER_CHANNELS = frozenset({Channel.STDOUT, Channel.STDERR, Channel.EXIT, Channel.ERROR})
"""Channels a server may send (what a client accepts)."""

OPS = ("exec", "sign", "ping")


# --- events -----------------------------------------------------------------
# Tuple subclasses: NamedTuple's attribute access and equality, without
# importing typing or collections on the per-call paths.


class Frame(tuple[int, bytes]):
    """One whole frame: its channel and payload."""

    __slots__ = ()

    def __new__(cls, channel: int, payload: bytes) -> Frame:
        return tuple.__new__(cls, (channel, payload))

    @property
    def channel(self) -> int:
        return self[0]

    @property
    def payload(self) -> bytes:
        return self[1]


class Payload(tuple[int, int]):
    """A passthrough frame's header: ``size`` payload bytes on ``channel`` come next.

    The caller moves them itself and reports each step to :meth:`Reader.passed`,
    or feeds them to the reader and gets :class:`Data` back.
    """

    __slots__ = ()

    def __new__(cls, channel: int, size: int) -> Payload:
        return tuple.__new__(cls, (channel, size))

    @property
    def channel(self) -> int:
        return self[0]

    @property
    def size(self) -> int:
        return self[1]


class Data(tuple[int, bytes]):
    """Part of a passthrough payload that was fed to the reader rather than moved."""

    __slots__ = ()

    def __new__(cls, channel: int, data: bytes) -> Data:
        return tuple.__new__(cls, (channel, data))

    @property
    def channel(self) -> int:
        return self[0]

    @property
    def data(self) -> bytes:
        return self[1]


# --- encoding ---------------------------------------------------------------


def frame_header(channel: int, length: int) -> bytes:
    """The 5 header bytes of a frame whose payload is ``length`` bytes long.

    Separate from :func:`encode_frame` so that big payloads can be sent with a
    vectored write (``sendmsg([header, payload])``) or spliced after it.
    """
    if not 0 <= length <= MAX_PAYLOAD:
        raise ValueError(f"payload of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    return bytes((channel,)) + length.to_bytes(4, "big")


def encode_frame(channel: int, payload: bytes = b"") -> bytes:
    """One whole frame."""
    return frame_header(channel, len(payload)) + payload


def encode_stdin(data: bytes) -> bytes:
    """Stdin bytes for the command; ``b""`` is EOF (use :func:`encode_stdin_eof`)."""
    return encode_frame(Channel.STDIN, data)


def encode_stdin_eof() -> bytes:
    """The stdin EOF frame (an empty stdin payload)."""
    return b"\0\0\0\0\0"


def encode_exit(status: int) -> bytes:
    """The final exit frame carrying ``status`` (shell rule: 128+N for signal N)."""
    return encode_frame(Channel.EXIT, status.to_bytes(4, "big", signed=True))


def encode_error(message: str) -> bytes:
    """The final error frame carrying a one-line human-readable ``message``."""
    data = message.encode("utf-8", "replace")[:MAX_PAYLOAD]
    return encode_frame(Channel.ERROR, data)


def encode_signal(signum: int) -> bytes:
    """A signal frame asking for ``signum`` to reach the command's process group."""
    if not 1 <= signum <= 255:
        raise ValueError(f"signal number {signum} out of range")
    return encode_frame(Channel.SIGNAL, bytes([signum]))


def decode_exit(payload: bytes) -> int:
    """The status in an exit frame's payload."""
    if len(payload) != 4:
        raise ProtocolError(f"exit frame payload is {len(payload)} bytes, expected 4")
    return int.from_bytes(payload, "big", signed=True)


def decode_signal(payload: bytes) -> int:
    """The signal number in a signal frame's payload."""
    if len(payload) != 1 or payload[0] == 0:
        raise ProtocolError("signal frame payload must be one byte naming a signal")
    return payload[0]


def decode_error(payload: bytes) -> str:
    """The message in an error frame's payload (invalid UTF-8 is replaced)."""
    return payload.decode("utf-8", "replace")


def final_status(frame: Frame) -> int | None:
    """What a server frame means for a client's exit: the status (0-255) of an exit
    frame, RequestRefused for an error frame, None for output."""
    if frame[0] == Channel.EXIT:
        return decode_exit(frame[1]) & 0xFF
    if frame[0] == Channel.ERROR:
        raise RequestRefused(decode_error(frame[1]))
    return None


# --- incremental decoding ---------------------------------------------------


def check_header(channel: int, length: int, accept: frozenset[int] | None) -> None:
    """Validate a decoded header: a known channel, allowed here, a length within the limit."""
    if channel >= len(CHANNEL_NAMES):
        raise ProtocolError(f"unknown channel {channel}")
    if accept is not None and channel not in accept:
        raise ProtocolError(f"channel {CHANNEL_NAMES[channel]} is not allowed here")
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"frame length {length} exceeds the {MAX_PAYLOAD}-byte limit")


_BETWEEN = -1  # the reader's channel between frames: a header comes next


class Reader:
    """One direction of a connection, decoded; the caller does the I/O.

    ``accept`` limits which channels are legal from this peer; anything else,
    and any length over :data:`MAX_PAYLOAD`, raises :class:`ProtocolError` as
    soon as the header's 5 bytes are in, before its payload is waited for.
    Events come out in stream order: frames before a bad header first, then
    the error.  After an error the reader is poisoned (every later call
    raises), so a caller cannot resynchronise on attacker-chosen bytes.

    Payloads on ``passthrough`` channels are announced (:class:`Payload`), not
    buffered; an empty one is still a :class:`Frame` (stdin's EOF).
    """

    __slots__ = ("_accept", "_buf", "_channel", "_error", "_left", "_pass", "_size")

    def __init__(
        self, accept: frozenset[int] | None = None, passthrough: frozenset[int] = frozenset()
    ) -> None:
        self._accept = accept
        self._pass = passthrough
        self._buf = bytearray()
        self._channel = _BETWEEN
        self._size = 0  # the current frame's payload length
        self._left = 0  # passthrough payload bytes not yet moved or handed out
        self._error: ProtocolError | None = None

    @property
    def passing(self) -> int:
        """Passthrough payload bytes the caller may move itself now.

        0 while bytes fed to the reader are still to be handed out as
        :class:`Data`: those come first, so the payload keeps its order.
        """
        return 0 if self._buf else self._left

    @property
    def buffered(self) -> int:
        """Bytes of the stream held that have not come out in an event (0 at a frame boundary)."""
        pending_header = self._channel != _BETWEEN and not self._left
        return len(self._buf) + (HEADER_SIZE if pending_header else 0)

    def want(self) -> int:
        """How many bytes to read next: the rest of the header or payload, never beyond.

        Reading no further than the current frame is what lets a caller splice
        the next frame's payload: none of it sits in this reader's buffer.
        """
        if self._channel == _BETWEEN:
            return max(HEADER_SIZE - len(self._buf), 0)
        return max((self._left or self._size) - len(self._buf), 0)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes read from the peer."""
        if self._error is not None:
            raise self._error
        self._buf += data

    def passed(self, count: int) -> None:
        """The caller moved ``count`` bytes of the announced payload itself."""
        if not 0 <= count <= self.passing:
            raise ValueError(f"{count} bytes passed, {self.passing} were announced")
        self._consume(count)

    def next_event(self) -> Frame | Payload | Data | None:
        """The next event, or None when more bytes are needed (read :meth:`want`)."""
        if self._error is not None:
            raise self._error
        if self._channel == _BETWEEN:
            announced = self._header()
            if announced is not None or self._channel == _BETWEEN:
                return announced
        if self._left:
            return self._data()
        return self._frame()

    def _header(self) -> Payload | None:
        buf = self._buf
        if len(buf) < HEADER_SIZE:
            return None
        channel = buf[0]
        size = int.from_bytes(buf[1:HEADER_SIZE], "big")
        try:
            check_header(channel, size, self._accept)
        except ProtocolError as exc:
            self._error = exc
            raise
        del buf[:HEADER_SIZE]  # deleting a bytearray's prefix is cheap (CPython moves its start)
        self._channel, self._size = channel, size
        if size and channel in self._pass:
            self._left = size
            return Payload(channel, size)
        return None

    def _data(self) -> Data | None:
        buf = self._buf
        if not buf:
            return None
        chunk = bytes(buf[: self._left])
        del buf[: len(chunk)]
        channel = self._channel
        self._consume(len(chunk))
        return Data(channel, chunk)

    def _consume(self, count: int) -> None:
        self._left -= count
        if not self._left:
            self._channel = _BETWEEN

    def _frame(self) -> Frame | None:
        buf, size = self._buf, self._size
        if len(buf) < size:
            return None
        payload = bytes(buf[:size])
        del buf[:size]
        channel, self._channel = self._channel, _BETWEEN
        return Frame(channel, payload)


class FrameDecoder:
    """Turns arbitrarily chunked bytes into whole frames (a :class:`Reader` without passthrough).

    For the tests and the fuzzer; the ends drive a :class:`Reader` themselves.
    """

    __slots__ = ("_reader",)

    def __init__(self, accept: frozenset[int] | None = None) -> None:
        self._reader = Reader(accept)

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame (0 at a frame boundary)."""
        return self._reader.buffered

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data`` and return every frame it completes, in order."""
        reader = self._reader
        reader.feed(data)
        frames: list[Frame] = []
        while (event := reader.next_event()) is not None:
            assert isinstance(event, Frame)  # no passthrough channels here
            frames.append(event)
        return frames


# --- requests ---------------------------------------------------------------


class Request:
    """What a client asks for: the first frame of a connection.

    (A plain class rather than a NamedTuple or dataclass: typing and
    dataclasses cost every client and gpg-shim start.)
    """

    __slots__ = ("argv", "cwd", "key", "op", "with_stdin")

    def __init__(
        self,
        argv: tuple[str, ...],
        cwd: str,
        with_stdin: bool = True,
        op: str = "exec",
        key: str | None = None,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.with_stdin = with_stdin
        self.op = op
        self.key = key

    def _fields(self) -> tuple[tuple[str, ...], str, bool, str, str | None]:
        return (self.argv, self.cwd, self.with_stdin, self.op, self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        argv, cwd, with_stdin, op, key = self._fields()
        return f"Request({argv=}, {cwd=}, {with_stdin=}, {op=}, {key=})"

    def without_stdin(self) -> Request:
        """The same request with no stdin (``with_stdin`` false)."""
        return Request(self.argv, self.cwd, False, self.op, self.key)

    def to_json(self) -> bytes:
        """The request frame's payload: ``json.dumps(..., separators=(",", ":"))``'s bytes."""
        parts = ['{"argv":[', ",".join(_json_string(a) for a in self.argv), '],"cwd":',
                 _json_string(self.cwd), ',"with_stdin":', "true" if self.with_stdin else "false"]
        if self.op != "exec":
            parts += [',"op":', _json_string(self.op)]
        if self.key is not None:
            parts += [',"key":', _json_string(self.key)]
        parts.append("}")
        return "".join(parts).encode("ascii")


def encode_request(request: Request) -> bytes:
    """The request frame for ``request``."""
    return encode_frame(Channel.REQUEST, request.to_json())


_ALLOWED_FIELDS = frozenset({"argv", "cwd", "with_stdin", "op", "key"})


def parse_request(payload: bytes) -> Request:
    """Validate a request frame's payload; refuse anything not in the contract.

    Every refusal names the offending field.  ``env`` gets its own message:
    the command's environment is the launcher's policy, never the request's.
    """
    import json  # here, not at the top: only the server parses requests

    try:
        body = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RequestRefused("request is not a UTF-8 JSON object") from None
    except RecursionError:  # [[[[... a megabyte deep
        raise RequestRefused("request JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestRefused("request is not a JSON object")
    if "env" in body:
        raise RequestRefused(
            "request field 'env' is refused: the environment is set by the broker's policy"
        )
    unknown = sorted(k for k in body if k not in _ALLOWED_FIELDS)
    if unknown:
        raise RequestRefused(f"unknown request field {unknown[0]!r} is refused")

    op = body.get("op", "exec")
    if op not in OPS:
        raise RequestRefused(f"request field 'op' must be one of {', '.join(OPS)}")
    key = body.get("key")
    if op == "sign":
        if not isinstance(key, str) or not key:
            raise RequestRefused("request field 'key' must be a non-empty string for op sign")
    elif "key" in body:
        raise RequestRefused("request field 'key' is only allowed with op sign")

    argv = body.get("argv", [] if op != "exec" else None)
    if (
        not isinstance(argv, list)
        or not all(isinstance(a, str) for a in argv)
        or (op == "exec" and not argv)
    ):
        raise RequestRefused("request field 'argv' must be a non-empty list of strings")
    if any("\0" in a for a in argv):
        raise RequestRefused("request field 'argv' must not contain NUL characters")

    cwd = body.get("cwd", "/" if op != "exec" else None)
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise RequestRefused("request field 'cwd' must be an absolute path")

    with_stdin = body.get("with_stdin", False)
    if not isinstance(with_stdin, bool):
        raise RequestRefused("request field 'with_stdin' must be true or false")

    return Request(argv=tuple(argv), cwd=cwd, with_stdin=with_stdin, op=op, key=key)
