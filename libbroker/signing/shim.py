"""gpg-shim's I/O: sign through the broker, verify with the local gpg.

The sandbox holds no secret key.  git asks for a signature with
``gpg --status-fd=2 -bsau KEY`` and the payload on stdin; :func:`sign` sends
the payload to the broker's ``sign`` op, which runs the host's real gpg (where
the person's agent and key live) and streams its output back.  What git reads
is exactly what gpg wrote: the armored signature on stdout and gpg's status
lines (``[GNUPG:] SIG_CREATED ...``, which git looks for) on the status fd.

Start-up is most of what a signature costs (git runs this once per
signature), so the signing path imports C modules only (``_socket``,
``_json``, ``select``) besides :mod:`libbroker.broker.dial`, :mod:`libbroker.errors`,
:mod:`libbroker.signing.args` and :mod:`libbroker.wire` (cheap on purpose, and the
one decoder of frames): no ``socket``, ``json``, ``enum`` or ``typing``.
Parsing lives in :mod:`libbroker.signing.args`, verification in
:mod:`libbroker.signing.local`.
"""

from __future__ import annotations

# posix, not os: the very functions os re-exports, without os's own import
# (os, stat, posixpath, _collections_abc: ~20% of a bare `python -I -S`).
import posix
import select
import sys

from libbroker.broker.dial import SOCKET_ENV_VAR, dial
from libbroker.errors import BrokerUnavailable, ProtocolError, RequestRefused, UsageError
from libbroker.signing.args import SignCall, StatusRouter
from libbroker.wire import (
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    Channel,
    Frame,
    Reader,
    Request,
    encode_frame,
    encode_request,
    encode_stdin_eof,
    final_status,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import _socket

MAX_SIGN_PAYLOAD = 64 << 20
"""The largest payload signed (64 MiB): a commit or tag is far smaller."""

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


def sign_frames(key: str, cwd: str, payload: bytes) -> bytes:
    """Everything gpg-shim sends: the request, the payload as stdin frames, EOF.

    argv is informative only: the server builds gpg's command line itself,
    from the key alone.
    """
    request = Request(("gpg", "--status-fd=2", "-bsau", key), cwd, True, "sign", key)
    parts = [encode_request(request)]
    for start in range(0, len(payload), MAX_PAYLOAD):
        parts.append(encode_frame(Channel.STDIN, payload[start : start + MAX_PAYLOAD]))
    parts.append(encode_stdin_eof())
    return b"".join(parts)


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
    reader = Reader(SERVER_CHANNELS)
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
        reader.feed(data)
        status = _act(reader, router)
        if status is not None:
            return status


def _act(reader: Reader, router: StatusRouter) -> int | None:
    """Write what the frames read so far carry, in order; the exit status once it came."""
    try:
        while (frame := reader.next_event()) is not None:
            assert isinstance(frame, Frame)  # no passthrough channels on this reader
            if frame.channel == Channel.STDOUT:
                _write_all(1, frame.payload)
            elif frame.channel == Channel.STDERR:
                _write_routed(router.feed(frame.payload))
            elif frame.channel == Channel.EXIT:
                _write_routed(router.flush())
            status = final_status(frame)
            if status is not None:
                return status
    except ProtocolError as exc:
        raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None
    except RequestRefused as exc:
        raise RequestRefused(f"the broker refused to sign: {exc}") from None
    return None


def _write_routed(writes: list[tuple[int, bytes]]) -> None:
    for fd, data in writes:
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def tell_git(line: str) -> None:
    """Write ``line`` to git's own stderr too, when git started us with ours captured.

    git runs gpg.program with its stderr in a pipe (the status fd is 2) and
    before 2.40 prints only "gpg failed to sign the data", dropping what gpg
    said: the reason of a refusal would never reach the agent.  So when the
    parent is git and its stderr is another file than ours, the line goes
    there as well (non-blocking: a full pipe loses it rather than hang the
    commit).  git 2.40 and later print it a second time, after their error.
    Best effort: any failure leaves it at our own stderr.
    """
    parent = f"/proc/{posix.getppid()}"
    try:
        fd = posix.open(parent + "/comm", posix.O_RDONLY | posix.O_CLOEXEC)
        try:
            comm = posix.read(fd, 64)
        finally:
            posix.close(fd)
        theirs, ours = posix.stat(parent + "/fd/2"), posix.fstat(2)
        if not comm.startswith(b"git") or (theirs.st_dev, theirs.st_ino) == (
            ours.st_dev, ours.st_ino
        ):
            return
        flags = posix.O_WRONLY | posix.O_APPEND | posix.O_NOCTTY | posix.O_NONBLOCK
        fd = posix.open(parent + "/fd/2", flags | posix.O_CLOEXEC)
        try:
            posix.write(fd, line.encode(errors="replace"))
        finally:
            posix.close(fd)
    except OSError:
        return


def _environ(name: str) -> str:
    """``os.environ.get(name, "")`` as this process started (posix keeps bytes)."""
    value = posix.environ.get(name.encode())
    return "" if value is None else value.decode(sys.getfilesystemencoding(), "surrogateescape")


def _cwd() -> str:
    try:
        return posix.getcwd()
    except OSError:
        return "/"


