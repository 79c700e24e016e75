"""The broker wire format (DESIGN.md 2.2) as pure functions: bytes in, frames out.

Nothing here touches a socket.  Both ends (broker-server, broker-client,
gpg-shim) feed whatever chunks the kernel hands them to a :class:`FrameDecoder`
and get whole frames back; they build outgoing bytes with the ``encode_*``
helpers.  Request validation lives here too, so that the one place deciding
what a request may contain is small enough to read in full.

A frame is ``channel (1 byte) · length (4 bytes, big-endian, unsigned) ·
payload``.  A payload is at most :data:`MAX_PAYLOAD` bytes: a peer announcing
more is refused before a byte of it is buffered, so a hostile length cannot
make the other side allocate.

Only the standard library and :mod:`libbroker.errors` are imported: the
per-call executables import this module on their hot path.
"""

from __future__ import annotations

import enum
import mmap
import struct

# The json package's own C string escaper (ASCII only; quotes, backslashes
# and control characters escaped): the client encodes its request by hand
# with it, since importing json (and re with it) costs every call.
from _json import encode_basestring_ascii as _json_string
from typing import NamedTuple

from libbroker.dial import SOCKET_ENV_VAR as SOCKET_ENV_VAR
from libbroker.errors import ProtocolError, RequestRefused

MAX_PAYLOAD = 1 << 20
"""The largest payload either side accepts (1 MiB)."""

HEADER = struct.Struct(">BI")
HEADER_SIZE = HEADER.size  # 5

_STATUS = struct.Struct(">i")


class Channel(enum.IntEnum):
    """The channel byte of a frame."""

    STDIN = 0
    STDOUT = 1
    STDERR = 2
    EXIT = 3
    ERROR = 4
    REQUEST = 5
    SIGNAL = 6


CLIENT_CHANNELS = frozenset({Channel.STDIN, Channel.REQUEST, Channel.SIGNAL})
"""Channels a client may send (what the server accepts)."""

SERVER_CHANNELS = frozenset({Channel.STDOUT, Channel.STDERR, Channel.EXIT, Channel.ERROR})
"""Channels a server may send (what a client accepts)."""

OPS = ("exec", "sign", "ping")


class Frame(NamedTuple):
    """One decoded frame."""

    channel: Channel
    payload: bytes


# --- encoding ---------------------------------------------------------------


def frame_header(channel: Channel, length: int) -> bytes:
    """The 5 header bytes of a frame whose payload is ``length`` bytes long.

    Separate from :func:`encode_frame` so that big payloads can be sent with a
    vectored write (``sendmsg([header, payload])``) instead of a copy.
    """
    if not 0 <= length <= MAX_PAYLOAD:
        raise ValueError(f"payload of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    return HEADER.pack(channel, length)


def encode_frame(channel: Channel, payload: bytes = b"") -> bytes:
    """One whole frame."""
    return frame_header(channel, len(payload)) + payload


def encode_stdin(data: bytes) -> bytes:
    """Stdin bytes for the command; ``b""`` is EOF (use :func:`encode_stdin_eof`)."""
    return encode_frame(Channel.STDIN, data)


def encode_stdin_eof() -> bytes:
    """The stdin EOF frame (an empty stdin payload)."""
    return HEADER.pack(Channel.STDIN, 0)


def encode_exit(status: int) -> bytes:
    """The final exit frame carrying ``status`` (shell rule: 128+N for signal N)."""
    return encode_frame(Channel.EXIT, _STATUS.pack(status))


def encode_error(message: str) -> bytes:
    """The final error frame carrying a one-line human-readable ``message``."""
    data = message.encode("utf-8", "replace")[: MAX_PAYLOAD]
    return encode_frame(Channel.ERROR, data)


def encode_signal(signum: int) -> bytes:
    """A signal frame asking for ``signum`` to reach the command's process group."""
    if not 1 <= signum <= 255:
        raise ValueError(f"signal number {signum} out of range")
    return encode_frame(Channel.SIGNAL, bytes([signum]))


def decode_exit(payload: bytes) -> int:
    """The status in an exit frame's payload."""
    if len(payload) != _STATUS.size:
        raise ProtocolError(f"exit frame payload is {len(payload)} bytes, expected 4")
    status: int = _STATUS.unpack(payload)[0]
    return status


def decode_signal(payload: bytes) -> int:
    """The signal number in a signal frame's payload."""
    if len(payload) != 1 or payload[0] == 0:
        raise ProtocolError("signal frame payload must be one byte naming a signal")
    return payload[0]


def decode_error(payload: bytes) -> str:
    """The message in an error frame's payload (invalid UTF-8 is replaced)."""
    return payload.decode("utf-8", "replace")


# --- incremental decoding ---------------------------------------------------


class FrameDecoder:
    """Turns arbitrarily chunked bytes into frames.

    ``accept`` limits which channels are legal from this peer; anything else,
    and any length over :data:`MAX_PAYLOAD`, raises :class:`ProtocolError`.
    After an error the decoder is poisoned: every later ``feed`` raises again,
    so a caller cannot accidentally resynchronise on attacker-chosen bytes.
    """

    __slots__ = ("_accept", "_buf", "_error", "_need")

    def __init__(self, accept: frozenset[Channel] | None = None) -> None:
        self._accept = accept
        self._buf = bytearray()
        self._error: ProtocolError | None = None
        self._need = HEADER_SIZE

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame (0 at a frame boundary)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data`` and return every frame it completes, in order."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return []
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        try:
            with memoryview(buf) as view:
                while end - pos >= HEADER_SIZE:
                    raw_channel, length = HEADER.unpack_from(buf, pos)
                    channel = self._check(raw_channel, length)
                    if end - pos - HEADER_SIZE < length:
                        break
                    start = pos + HEADER_SIZE
                    frames.append(Frame(channel, view[start : start + length].tobytes()))
                    pos = start + length
        finally:
            # Deleting a prefix of a bytearray is cheap (CPython moves its start).
            del buf[:pos]
        self._need = HEADER_SIZE if len(buf) < HEADER_SIZE else HEADER_SIZE + HEADER.unpack_from(
            buf, 0
        )[1]
        return frames

    def _check(self, raw_channel: int, length: int) -> Channel:
        try:
            return check_header(raw_channel, length, self._accept)
        except ProtocolError as exc:
            self._error = exc
            raise


def lazy_buffer(size: int) -> mmap.mmap:
    """A zeroed buffer whose pages cost nothing until touched.

    ``bytearray(n)`` writes all n bytes up front: ~1.5 ms and 1 MiB of memory
    for a 1 MiB read buffer, paid on every client start.
    """
    return mmap.mmap(-1, size)


def check_header(raw_channel: int, length: int, accept: frozenset[Channel] | None) -> Channel:
    """Validate a decoded header: a known channel, allowed here, a length within the limit."""
    try:
        channel = Channel(raw_channel)
    except ValueError:
        raise ProtocolError(f"unknown channel {raw_channel}") from None
    if accept is not None and channel not in accept:
        raise ProtocolError(f"channel {channel.name.lower()} is not allowed here")
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"frame length {length} exceeds the {MAX_PAYLOAD}-byte limit")
    return channel


# --- requests ---------------------------------------------------------------


class Request(NamedTuple):
    """What a client asks for: the first frame of a connection.

    (A NamedTuple rather than a dataclass: dataclasses costs the client ~5 ms.)
    """

    argv: tuple[str, ...]
    cwd: str
    with_stdin: bool = True
    op: str = "exec"
    key: str | None = None

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
