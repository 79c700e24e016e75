"""A light asyncio broker client for load and attacks, built on libbroker.wire.

broker-client is a process per command; hundreds of them at once would mostly
measure Python start-up on a 2-core machine.  This client speaks the same
bytes (the public encoders and FrameDecoder of :mod:`libbroker.wire`) from one
event loop, so the server is what gets loaded.  Raw byte exchanges serve the
attacks that need frames no honest client would send.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from libbroker.wire import (
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    Channel,
    FrameDecoder,
    Request,
    decode_error,
    decode_exit,
    encode_request,
    encode_stdin,
    encode_stdin_eof,
)


@dataclass
class Outcome:
    """What came back for one command."""

    status: int | None = None
    error: str | None = None
    stdout_len: int = 0
    stdout_head: bytes = b""
    stderr: bytes = b""
    digest: str = ""
    seconds: float = 0.0
    frames: list[tuple[int, int]] = field(default_factory=list)  # (channel, length)


async def _pump_stdin(writer: asyncio.StreamWriter, data: bytes) -> None:
    view = memoryview(data)
    for start in range(0, len(view), MAX_PAYLOAD):
        writer.write(encode_stdin(bytes(view[start:start + MAX_PAYLOAD])))
        await writer.drain()
    writer.write(encode_stdin_eof())
    await writer.drain()


async def run(sock: str, argv: list[str], cwd: str, stdin: bytes | None = None,
              timeout: float = 60.0) -> Outcome:
    """Run ``argv`` through the broker; stdout is hashed, not kept (10 MiB outputs)."""
    started = time.monotonic()
    out = Outcome()
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(sock), timeout)
    pump: asyncio.Task[None] | None = None
    try:
        writer.write(encode_request(Request(argv=tuple(argv), cwd=cwd,
                                            with_stdin=stdin is not None)))
        if stdin is not None:
            pump = asyncio.create_task(_pump_stdin(writer, stdin))
        await asyncio.wait_for(_read(reader, out), timeout)
    finally:
        if pump is not None and not pump.done():
            pump.cancel()
        writer.close()
    out.seconds = time.monotonic() - started
    return out


async def _read(reader: asyncio.StreamReader, out: Outcome) -> None:
    decoder = FrameDecoder(accept=SERVER_CHANNELS)
    digest = hashlib.sha256()
    while out.status is None and out.error is None:
        data = await reader.read(1 << 20)
        if not data:
            out.error = out.error or "connection closed without an exit frame"
            break
        for frame in decoder.feed(data):
            out.frames.append((int(frame.channel), len(frame.payload)))
            if frame.channel == Channel.STDOUT:
                out.stdout_len += len(frame.payload)
                digest.update(frame.payload)
                if len(out.stdout_head) < 4096:
                    out.stdout_head += frame.payload[:4096]
            elif frame.channel == Channel.STDERR:
                if len(out.stderr) < 65536:
                    out.stderr += frame.payload
            elif frame.channel == Channel.EXIT:
                out.status = decode_exit(frame.payload)
            elif frame.channel == Channel.ERROR:
                out.error = decode_error(frame.payload)
    out.digest = digest.hexdigest()


async def raw(sock: str, data: bytes, timeout: float = 10.0,
              close_after_send: bool = False) -> Outcome:
    """Send ``data`` as is; collect whatever frames come back until the end."""
    started = time.monotonic()
    out = Outcome()
    reader, writer = await asyncio.open_unix_connection(sock)
    try:
        writer.write(data)
        await writer.drain()
        if close_after_send and writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_read(reader, out), timeout)
    except TimeoutError:
        out.error = out.error or "timeout: no final frame"
    except ConnectionError as exc:
        out.error = out.error or f"connection error: {exc}"
    finally:
        writer.close()
    out.seconds = time.monotonic() - started
    return out
