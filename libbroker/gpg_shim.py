"""git's ``gpg.program`` inside the sandbox: signing goes to the broker.

The sandbox holds no secret key.  git asks for a signature with
``gpg --status-fd=2 -bsau KEY`` and the payload on stdin; this module sends the
payload to the broker's ``sign`` op, which runs the host's real gpg (where the
person's agent and key live) and streams its output back.  What git reads is
exactly what gpg wrote: the armored signature on stdout and gpg's status lines
(``[GNUPG:] SIG_CREATED ...``, which git looks for) on the status fd.

Verification needs only public keys, so a ``--verify`` call (``git
verify-commit``, ``log --show-signature``) is handed, arguments untouched, to
the local gpg.

The argument parsing and the status-line routing are pure; :func:`sign` and
:func:`exec_local_gpg` are the thin I/O shells.  Only the standard library
and the broker's wire and client modules are imported: git runs this once
per signature.
"""

from __future__ import annotations

import os
import select
import socket
import sys
from collections.abc import Iterable
from typing import NamedTuple

from libbroker.client import connect, socket_path
from libbroker.errors import BrokerUnavailable, ProtocolError, RequestRefused, UsageError
from libbroker.wire import (
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    SOCKET_ENV_VAR,
    Channel,
    FrameDecoder,
    Request,
    decode_error,
    decode_exit,
    encode_request,
    encode_stdin_eof,
    frame_header,
)

STATUS_PREFIX = b"[GNUPG:] "
MAX_SIGN_PAYLOAD = 64 << 20
"""The largest payload signed (64 MiB): a commit or tag is far smaller."""

# Set while exec'ing the local gpg: if that gpg is itself a wrapper that runs
# gpg-shim again, the second shim stops instead of looping.
_LOOP_GUARD = "AGENT_SANDBOX_GPG_SHIM_EXEC"

# Options that are harmless in a signing call and carry no meaning for the
# broker (it always runs ``gpg --status-fd=2 -bsau KEY``).
_IGNORED_FLAGS = frozenset({"--batch", "--no-tty", "--yes"})
_VALUE_OPTIONS = frozenset({"--status-fd", "--local-user", "--keyid-format"})
_SIGN_FLAGS = frozenset({"--detach-sign", "--sign", "--armor"})
_SIGN_WORDS = frozenset({"--sign", "--detach-sign", "--clearsign", "--clear-sign"})


class SignCall(NamedTuple):
    """git asks for a detached armored signature by ``key``; status lines go to ``status_fd``."""

    key: str
    status_fd: int | None


class VerifyCall(NamedTuple):
    """Anything with ``--verify``: the local gpg runs it with these arguments."""

    args: tuple[str, ...]


# --- parsing git's command lines ---------------------------------------------


def parse_args(args: list[str]) -> SignCall | VerifyCall:
    """Classify and check gpg-style arguments as git passes them.

    Signing accepts the forms git uses and their equivalents: ``-bsau KEY``,
    ``-b -s -a -u KEY``, ``-uKEY``, ``--local-user=KEY``, ``--detach-sign
    --armor``, ``--status-fd=N`` or ``--status-fd N``.  The result must be a
    detached, armored signature by exactly one key, since that is the only
    thing the broker makes; anything else is a UsageError naming the problem.
    """
    if "--verify" in args:
        return VerifyCall(tuple(args))
    flags: set[str] = set()
    keys: list[str] = []
    status_fd: int | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in _VALUE_OPTIONS:
                if not eq:
                    if i >= len(args):
                        raise UsageError(f"option {name} needs a value")
                    value = args[i]
                    i += 1
                if name == "--status-fd":
                    status_fd = _fd_number(value)
                elif name == "--local-user":
                    keys.append(value)
                continue  # --keyid-format only shapes output gpg prints for verification
            if name in _SIGN_WORDS - _SIGN_FLAGS:
                raise UsageError(f"{name} is not supported: git signs with -bsau KEY")
            if name not in _SIGN_FLAGS and name not in _IGNORED_FLAGS:
                raise UsageError(f"unsupported option {name}")
            if eq:
                raise UsageError(f"option {name} takes no value")
            if name in _SIGN_FLAGS:
                flags.add(name[2])  # d, s, a
        elif arg.startswith("-") and arg != "-":
            i = _short_cluster(arg, args, i, flags, keys)
        else:
            raise UsageError(f"unexpected argument {arg!r}: the payload is read from stdin")
    if not flags & {"b", "d", "s"}:
        raise UsageError("nothing to do: gpg-shim signs (-bsau KEY) or verifies (--verify)")
    if not flags & {"b", "d"}:
        raise UsageError("only detached signatures (-b) are supported")
    if "a" not in flags:
        raise UsageError("only armored signatures (-a) are supported")
    if len(keys) != 1 or not keys[0]:
        raise UsageError("name exactly one signing key with -u KEY")
    return SignCall(keys[0], status_fd)


def _short_cluster(arg: str, args: list[str], i: int, flags: set[str], keys: list[str]) -> int:
    """Read ``-bsau`` style flags; ``u`` takes the rest of the cluster or the next argument."""
    for pos in range(1, len(arg)):
        letter = arg[pos]
        if letter in "bsa":
            flags.add(letter)
        elif letter == "u":
            rest = arg[pos + 1 :]
            if rest:
                keys.append(rest)
                return i
            if i >= len(args):
                raise UsageError("option -u needs a key")
            keys.append(args[i])
            return i + 1
        else:
            raise UsageError(f"unsupported option -{letter}")
    return i


def _fd_number(value: str) -> int:
    if not value.isdigit() or len(value) > 9:
        raise UsageError(f"--status-fd {value!r} is not a file descriptor number")
    return int(value)


class StatusRouter:
    """Splits the server's stderr (gpg's messages and status lines) by line.

    The broker runs ``gpg --status-fd=2``, so status lines and human messages
    arrive as one stream.  git always asks for ``--status-fd=2`` and then both
    belong on fd 2 as they are; for any other status fd, lines starting with
    ``[GNUPG:] `` go there and the rest to stderr, as gpg itself would do.
    """

    def __init__(self, status_fd: int | None) -> None:
        self.status_fd = status_fd
        self._partial = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (fd, bytes) writes ``data`` completes, in order."""
        if self.status_fd == 2:
            return [(2, data)] if data else []
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return self._route(line + b"\n" for line in lines)

    def flush(self) -> list[tuple[int, bytes]]:
        """Writes for a last line without its newline."""
        partial, self._partial = self._partial, b""
        return self._route([partial] if partial else [])

    def _route(self, lines: Iterable[bytes]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for line in lines:
            status = self.status_fd is not None and line.startswith(STATUS_PREFIX)
            fd = self.status_fd if status else 2
            assert fd is not None
            if out and out[-1][0] == fd:
                out[-1] = (fd, out[-1][1] + line)
            else:
                out.append((fd, line))
        return out


# --- I/O shells ---------------------------------------------------------------


def check_fd(fd: int) -> None:
    """UsageError unless ``fd`` is an open file descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"--status-fd {fd} is not an open file descriptor") from None


def read_payload(fd: int = 0) -> bytes:
    """All of stdin, up to MAX_SIGN_PAYLOAD bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_SIGN_PAYLOAD:
            raise UsageError(f"the payload to sign exceeds {MAX_SIGN_PAYLOAD >> 20} MiB")
        chunks.append(chunk)


def sign(call: SignCall, payload: bytes, *, path: str | None = None) -> int:
    """Have the broker sign ``payload``; write gpg's output; return gpg's exit status."""
    if call.status_fd is not None:
        check_fd(call.status_fd)
    request = Request(
        argv=("gpg", "--status-fd=2", "-bsau", call.key),  # informative: the server builds its own
        cwd=_cwd(),
        with_stdin=True,
        op="sign",
        key=call.key,
    )
    outgoing = [encode_request(request)]
    for start in range(0, len(payload), MAX_PAYLOAD):
        chunk = payload[start : start + MAX_PAYLOAD]
        outgoing += [frame_header(Channel.STDIN, len(chunk)), chunk]
    outgoing.append(encode_stdin_eof())
    if path is None and not os.environ.get(SOCKET_ENV_VAR):
        raise BrokerUnavailable(
            f"cannot sign: {SOCKET_ENV_VAR} is not set (signing works inside an agent-sandbox "
            "session, through its broker)"
        )
    with connect(socket_path(path)) as sock:
        return _exchange(sock, b"".join(outgoing), StatusRouter(call.status_fd))


def _exchange(sock: socket.socket, outgoing: bytes, router: StatusRouter) -> int:
    """Send everything while reading whatever comes back, until the exit frame."""
    decoder = FrameDecoder(accept=SERVER_CHANNELS)
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
            data = sock.recv(MAX_PAYLOAD + 5)
        except BlockingIOError:
            continue
        except OSError as exc:
            raise BrokerUnavailable(f"lost the broker connection: {exc.strerror}") from None
        if not data:
            raise BrokerUnavailable("the broker closed the connection before gpg finished")
        try:
            for channel, frame in decoder.feed(data):
                if channel is Channel.STDOUT:
                    _write_all(1, frame)
                elif channel is Channel.STDERR:
                    _write_routed(router.feed(frame))
                elif channel is Channel.ERROR:
                    raise RequestRefused(f"the broker refused to sign: {decode_error(frame)}")
                else:
                    _write_routed(router.flush())
                    return decode_exit(frame) & 0xFF
        except ProtocolError as exc:
            raise BrokerUnavailable(f"the broker sent a malformed frame: {exc}") from None


def _write_routed(writes: list[tuple[int, bytes]]) -> None:
    for fd, data in writes:
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return "/"


def exec_local_gpg(args: tuple[str, ...]) -> None:
    """Replace this process with the local gpg running ``args`` (never returns)."""
    if os.environ.get(_LOOP_GUARD):
        raise UsageError("the local gpg runs gpg-shim again: put the real gpg first on PATH")
    gpg = find_local_gpg()
    os.environ[_LOOP_GUARD] = "1"
    sys.stdout.flush()
    try:
        os.execv(gpg, ["gpg", *args])  # noqa: S606 - argv exactly as git gave it, no shell
    except OSError as exc:
        raise UsageError(f"cannot run the local gpg {gpg}: {exc.strerror}") from None


def find_local_gpg() -> str:
    """The first ``gpg`` on PATH that is not this program under another name."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", "gpg")
        if (
            os.path.isfile(candidate)
            and os.access(candidate, os.X_OK)
            and os.path.realpath(candidate) != me
        ):
            return candidate
    raise UsageError("no gpg found on PATH to verify with")
