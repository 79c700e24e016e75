"""The gateway's control socket: a unix socket, mode 0600, this uid's peers only.

The socket is bound under a 0177 umask (never a moment with wider access) and
each connecting process's uid is read from the kernel (``SO_PEERCRED``): a
peer of another uid gets one error line and is closed, and the refusal is
logged.  Requests and replies are the JSON lines of
:mod:`libegress.control_frames`; a malformed line is answered with an error
and the connection stays usable, a line longer than ``MAX_LINE`` ends it.
A reply can carry a minted password: it goes to the peer and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

from libbroker.errors import EgressError, SocketInUse, UsageError
from libbroker.unix_listen import listen_unix
from libegress.control_frames import MAX_LINE, Add, BadFrame, Remove, parse_request, reply
from libegress.eventlog import EventLog

if TYPE_CHECKING:
    from libegress.gateway import Gate

_UCRED = struct.Struct("=iII")  # pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of unix socket ``sock``."""
    uid: int
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                              _UCRED.size))
    return uid


class Control:
    """The bound control socket and its serving loop."""

    def __init__(self, path: str, sock: socket.socket) -> None:
        self.path = path
        self._sock = sock

    async def serve(self, gate: Gate, log: EventLog) -> None:
        server = await asyncio.start_unix_server(
            lambda r, w: self._client(gate, log, r, w), sock=self._sock, limit=MAX_LINE + 1)
        async with server:
            await server.serve_forever()

    async def _client(self, gate: Gate, log: EventLog, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            if uid != os.getuid():
                log.note(f"control: refused a peer of uid {uid}")
                writer.write(reply(False, error=f"control: peer uid {uid} is not the "
                                                f"gateway's uid {os.getuid()}"))
                await writer.drain()
                return
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    log.note("control: a request line over the limit; connection closed")
                    writer.write(reply(False, error=f"request line longer than {MAX_LINE} bytes"))
                    await writer.drain()
                    return
                writer.write(await answer(gate, log, line.rstrip(b"\r\n")))
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


async def answer(gate: Gate, log: EventLog, line: bytes) -> bytes:
    """The reply line to one request line."""
    try:
        request = parse_request(line)
        if isinstance(request, Add):
            return reply(True, **await gate.add(request))
        if isinstance(request, Remove):
            closed = await gate.remove(request.tenant)
            return reply(True, tenant=request.tenant, closed=closed)
        return reply(True, tenants=[{"tenant": t.name, "connections": len(t.tasks)}
                                    for t in gate.tenants.values()])
    except BadFrame as exc:
        log.note(f"control: malformed request: {exc}")
        return reply(False, error=str(exc))
    except (UsageError, EgressError) as exc:
        log.note(f"control: refused: {exc}")
        return reply(False, error=str(exc))
    except Exception as exc:  # a control client never ends the gateway
        log.note(f"control: internal error: {type(exc).__name__}")
        return reply(False, error=f"internal error: {type(exc).__name__}")


def open_control(path: str) -> Control:
    """Bind and listen at ``path`` (0600, a stale socket replaced); UsageError when it cannot."""
    try:
        return Control(path, listen_unix(path, 64))
    except SocketInUse as exc:
        raise UsageError(f"--control: {exc}") from None


def control_request(path: str, frame: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send one request and read its reply (a blocking client, for tools and tests)."""
    import json

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(frame).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    result: dict[str, Any] = json.loads(data)
    return result
