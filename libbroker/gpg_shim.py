"""gpg-shim's I/O: sign through the broker, verify with the local gpg.

The sandbox holds no secret key.  git asks for a signature with
``gpg --status-fd=2 -bsau KEY`` and the payload on stdin; :func:`sign` sends
the payload to the broker's ``sign`` op, which runs the host's real gpg (where
the person's agent and key live) and streams its output back.  What git reads
is exactly what gpg wrote: the armored signature on stdout and gpg's status
lines (``[GNUPG:] SIG_CREATED ...``, which git looks for) on the status fd.

Only the standard library and the broker's wire and client modules are
imported: git runs this once per signature.  Parsing lives in
:mod:`libbroker.gpg_args`, verification in :mod:`libbroker.gpg_local`.
"""

from __future__ import annotations

import os
import select
import socket

from libbroker.client import connect, socket_path
from libbroker.errors import BrokerUnavailable, ProtocolError, RequestRefused, UsageError
from libbroker.gpg_args import SignCall, StatusRouter
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

MAX_SIGN_PAYLOAD = 64 << 20
"""The largest payload signed (64 MiB): a commit or tag is far smaller."""

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


def sign(call: SignCall, *, stdin_fd: int = 0, path: str | None = None) -> int:
    """Have the broker sign what ``stdin_fd`` holds; write gpg's output; return its status.

    The broker is reached before stdin is read, so an unreachable broker is
    reported at once, whatever is (or is not) on stdin.
    """
    if call.status_fd is not None:
        check_fd(call.status_fd)
    if path is None and not os.environ.get(SOCKET_ENV_VAR):
        raise BrokerUnavailable(
            f"cannot sign: {SOCKET_ENV_VAR} is not set (signing works inside an agent-sandbox "
            "session, through its broker)"
        )
    with connect(socket_path(path)) as sock:
        payload = read_payload(stdin_fd)
        # argv is informative only: the server builds gpg's command line itself.
        request = Request(
            argv=("gpg", "--status-fd=2", "-bsau", call.key),
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


def program_script(python: str, root: str) -> str:
    """A ``gpg.program`` for git that starts gpg-shim without site-packages.

    git runs ``gpg.program`` by path, once per signature and once per commit
    verified, so start-up is most of gpg-shim's cost.  The console script
    pays for ``site`` and every ``.pth`` file in the environment; gpg-shim
    needs only the standard library and this project, so the script below
    runs ``python -I -S`` with ``root`` (the directory holding ``libbroker``)
    as its only addition to ``sys.path``.  ``$0`` becomes ``sys.argv[0]``, so
    the shim still recognises itself on PATH when looking for the local gpg.
    """
    import json
    import shlex

    code = (  # a JSON string is a valid Python string literal
        f"import sys; sys.path.insert(0, {json.dumps(root)}); sys.argv[:2] = sys.argv[1:2]; "
        "from bin.gpg_shim import main; main()"
    )
    return (
        "#!/bin/sh\n"
        "# git's gpg.program: gpg-shim (agent-sandbox), started without site-packages.\n"
        f'exec {shlex.quote(python)} -I -S -c {shlex.quote(code)} "$0" "$@"\n'
    )
