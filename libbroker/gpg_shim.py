"""gpg-shim's I/O: sign through the broker, verify with the local gpg.

The sandbox holds no secret key.  git asks for a signature with
``gpg --status-fd=2 -bsau KEY`` and the payload on stdin; :func:`sign` sends
the payload to the broker's ``sign`` op, which runs the host's real gpg (where
the person's agent and key live) and streams its output back.  What git reads
is exactly what gpg wrote: the armored signature on stdout and gpg's status
lines (``[GNUPG:] SIG_CREATED ...``, which git looks for) on the status fd.

Start-up is most of what a signature costs (git runs this once per
signature), so the signing path imports C modules only (``_socket``,
``_json``, ``select``) besides :mod:`libbroker.dial`, :mod:`libbroker.errors`
and :mod:`libbroker.gpg_args`: no ``socket``, ``json``, ``enum`` or
``typing``, and therefore not :mod:`libbroker.wire` either.  The few frame
rules this side needs are restated below, and a test holds them equal to
:mod:`libbroker.wire`.  Parsing lives in :mod:`libbroker.gpg_args`,
verification in :mod:`libbroker.gpg_local`.
"""

from __future__ import annotations

# posix, not os: the very functions os re-exports, without os's own import
# (os, stat, posixpath, _collections_abc: ~20% of a bare `python -I -S`).
import posix
import select
import sys
from _json import encode_basestring_ascii as _json_string

from libbroker.dial import SOCKET_ENV_VAR, dial
from libbroker.errors import BrokerUnavailable, ProtocolError, RequestRefused, UsageError
from libbroker.gpg_args import SignCall, StatusRouter

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import _socket

MAX_SIGN_PAYLOAD = 64 << 20
"""The largest payload signed (64 MiB): a commit or tag is far smaller."""

# The wire format (DESIGN.md 2.2) as far as signing needs it; equal to
# libbroker.wire's values (tests/signing/test_gpg_shim_wire.py).
MAX_PAYLOAD = 1 << 20
HEADER_SIZE = 5
STDIN, STDOUT, STDERR, EXIT, ERROR, REQUEST = 0, 1, 2, 3, 4, 5
CHANNEL_NAMES = ("stdin", "stdout", "stderr", "exit", "error", "request", "signal")
SERVER_CHANNELS = frozenset({STDOUT, STDERR, EXIT, ERROR})


def check_fd(fd: int) -> None:
    """UsageError unless ``fd`` is an open file descriptor of this process."""
    try:
        posix.fstat(fd)
    except OSError:
        raise UsageError(f"--status-fd {fd} is not an open file descriptor") from None


def read_payload(fd: int = 0) -> bytes:
    """All of stdin, up to MAX_SIGN_PAYLOAD bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = posix.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_SIGN_PAYLOAD:
            raise UsageError(f"the payload to sign exceeds {MAX_SIGN_PAYLOAD >> 20} MiB")
        chunks.append(chunk)


def sign_request(key: str, cwd: str) -> bytes:
    """The request payload for op sign: the bytes libbroker.wire's encoder makes.

    Strings are quoted by the json module's own C escaper (ASCII only, every
    quote, backslash and control character escaped), so no key or path can
    break out of its string.  argv is informative only: the server builds
    gpg's command line itself, from the key alone.
    """
    k = _json_string(key)
    return (
        f'{{"argv":["gpg","--status-fd=2","-bsau",{k}],"cwd":{_json_string(cwd)},'
        f'"with_stdin":true,"op":"sign","key":{k}}}'
    ).encode("ascii")


def frame(channel: int, payload: bytes = b"") -> bytes:
    """One whole frame (``payload`` at most MAX_PAYLOAD bytes)."""
    return bytes((channel,)) + len(payload).to_bytes(4, "big") + payload


def sign_frames(key: str, cwd: str, payload: bytes) -> bytes:
    """Everything gpg-shim sends: the request, the payload as stdin frames, EOF."""
    parts = [frame(REQUEST, sign_request(key, cwd))]
    for start in range(0, len(payload), MAX_PAYLOAD):
        parts.append(frame(STDIN, payload[start : start + MAX_PAYLOAD]))
    parts.append(frame(STDIN))
    return b"".join(parts)


def take_frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """Remove the whole server frames at the start of ``buf`` and return them.

    Every header is checked as soon as its 5 bytes are there, so a channel a
    server may not send or a length over MAX_PAYLOAD is a ProtocolError
    before any of its payload is waited for.  The frames before a bad header
    are returned first (the bad header stays in ``buf`` and the next call
    raises): frames are acted on in stream order, however the bytes arrived.
    """
    frames: list[tuple[int, bytes]] = []
    pos = 0
    while len(buf) - pos >= HEADER_SIZE:
        channel = buf[pos]
        length = int.from_bytes(buf[pos + 1 : pos + HEADER_SIZE], "big")
        fault = ""
        if channel >= len(CHANNEL_NAMES):
            fault = f"unknown channel {channel}"
        elif channel not in SERVER_CHANNELS:
            fault = f"channel {CHANNEL_NAMES[channel]} is not allowed here"
        elif length > MAX_PAYLOAD:
            fault = f"frame length {length} exceeds the {MAX_PAYLOAD}-byte limit"
        if fault and frames:
            break
        if fault:
            raise ProtocolError(fault)
        end = pos + HEADER_SIZE + length
        if end > len(buf):
            break
        frames.append((channel, bytes(buf[pos + HEADER_SIZE : end])))
        pos = end
    del buf[:pos]
    return frames


def exit_status(payload: bytes) -> int:
    """The status in an exit frame's payload (4 bytes, big-endian, signed)."""
    if len(payload) != 4:
        raise ProtocolError(f"exit frame payload is {len(payload)} bytes, expected 4")
    return int.from_bytes(payload, "big", signed=True)


def sign(call: SignCall, *, stdin_fd: int = 0, path: str | None = None) -> int:
    """Have the broker sign what ``stdin_fd`` holds; write gpg's output; return its status.

    The broker is reached before stdin is read, so an unreachable broker is
    reported at once, whatever is (or is not) on stdin.
    """
    if call.status_fd is not None:
        check_fd(call.status_fd)
    path = path or _environ(SOCKET_ENV_VAR)
    if not path:
        raise BrokerUnavailable(
            f"cannot sign: {SOCKET_ENV_VAR} is not set (signing works inside an agent-sandbox "
            "session, through its broker)"
        )
    sock = dial(path)
    try:
        outgoing = sign_frames(call.key, _cwd(), read_payload(stdin_fd))
        return _exchange(sock, outgoing, StatusRouter(call.status_fd))
    finally:
        sock.close()


def _exchange(sock: _socket.socket, outgoing: bytes, router: StatusRouter) -> int:
    """Send everything while reading whatever comes back, until the exit frame."""
    incoming = bytearray()
    pending = memoryview(outgoing)
    sock.setblocking(False)
    while True:
        _, writable, _ = select.select([sock], [sock] if pending else [], [])
        if writable:
            try:
                pending = pending[sock.send(pending) :]
            except BlockingIOError:
                pass
            except OSError:
                pending = pending[:0]  # gone: its error or exit frame may still be readable
        try:
            data = sock.recv(1 << 16)  # gpg says little: a signature and a few status lines
        except BlockingIOError:
            continue
        except OSError as exc:
            raise BrokerUnavailable(f"lost the broker connection: {exc.strerror}") from None
        if not data:
            raise BrokerUnavailable("the broker closed the connection before gpg finished")
        incoming += data
        try:
            while frames := take_frames(incoming):
                status = _act(frames, router)
                if status is not None:
                    return status
        except ProtocolError as exc:
            raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None


def _act(frames: list[tuple[int, bytes]], router: StatusRouter) -> int | None:
    """Write what ``frames`` carry, in order; the exit frame's status, if it came."""
    for channel, payload in frames:
        if channel == STDOUT:
            _write_all(1, payload)
        elif channel == STDERR:
            _write_routed(router.feed(payload))
        elif channel == ERROR:
            message = payload.decode("utf-8", "replace")
            raise RequestRefused(f"the broker refused to sign: {message}")
        else:
            _write_routed(router.flush())
            return exit_status(payload) & 0xFF
    return None


def _write_routed(writes: list[tuple[int, bytes]]) -> None:
    for fd, data in writes:
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def _environ(name: str) -> str:
    """``os.environ.get(name, "")`` as this process started (posix keeps bytes)."""
    value = posix.environ.get(name.encode())
    return "" if value is None else value.decode(sys.getfilesystemencoding(), "surrogateescape")


def _cwd() -> str:
    try:
        return posix.getcwd()
    except OSError:
        return "/"


def program_script(python: str, root: str) -> str:
    """A ``gpg.program`` for git that starts gpg-shim without site-packages.

    git runs ``gpg.program`` by path, once per signature and once per commit
    verified, so start-up is most of gpg-shim's cost: see
    :func:`libbroker.start_script.start_script`.  ``sys.argv[0]`` is the
    script's path, so the shim still recognises itself on PATH when looking
    for the local gpg.
    """
    from libbroker.start_script import start_script

    return start_script(python, root, "bin.gpg_shim", "git's gpg.program: gpg-shim")
