"""The broker server owns its connections: whatever ends the serving, each is ended and awaited.

A real server (``serve``) in this process on a real unix socket, a real
sandboxed ``sleep`` started through it; the serving task is then cancelled
(not signalled), the path a bug or an embedding caller takes.  The command
must be killed and reaped, the client must get its final frame and the
socket must be gone before ``serve`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

import pytest

from libbroker.broker.audit import AuditLog
from libbroker.broker.connection import Settings
from libbroker.broker.executor_choice import make_executor
from libbroker.broker.profile import default_profile
from libbroker.broker.server import serve
from libbroker.wire import SERVER_CHANNELS, Frame, Reader, Request, encode_request, final_status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("stop", ["cancel", "error in the caller"])
def test_cancelled_serving_ends_and_awaits_every_connection(tmp_path, stop) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    path = str(tmp_path / "broker.sock")
    pidfile = workdir / "pid"
    executor = make_executor("auto", default_profile(), str(workdir), os.environ)
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    settings = Settings(workdir=str(workdir), executor=executor, audit=audit)

    async def scenario() -> tuple[int | None, int]:
        server = asyncio.create_task(serve(path, settings))
        while not os.path.exists(path):
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        await loop.sock_connect(client, path)
        sleep = f"sleep 60.{os.getpid()}"  # a command line no other process has
        argv = ("/bin/sh", "-c", f"echo $$ > {pidfile}; exec {sleep}")
        await loop.sock_sendall(client, encode_request(Request(argv, str(workdir), False)))
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.01)
        # The pid inside a PID namespace is not the host's: find the sleep by
        # its command line among this user's processes instead (the shell writes
        # the pid file before its exec: under load the sleep comes a little later).
        sleeper = await _host_pid_of(sleep)

        async def final() -> int | None:
            """The client reads as a client does, and hangs up after the final frame (a
            client that reads only once serve() has returned keeps the connection open
            for the whole shutdown grace)."""
            status = None
            reader = Reader(SERVER_CHANNELS)
            while status is None and (data := await loop.sock_recv(client, 65536)):
                reader.feed(data)
                while status is None and (frame := reader.next_event()) is not None:
                    if isinstance(frame, Frame):
                        status = final_status(frame)
            client.close()
            return status

        reading = asyncio.create_task(final())
        server.cancel(None if stop == "cancel" else "the caller failed")
        with contextlib.suppress(asyncio.CancelledError):
            await server
        assert not os.path.exists(path), "the socket outlived serve()"
        # (the connection ended when the client hung up after its final frame)
        assert reading.done(), "serve() returned before its connection ended"
        status = await asyncio.wait_for(reading, 10)
        return status, sleeper

    try:
        status, sleeper = asyncio.run(scenario())
    finally:
        executor.close()
        audit.close()
    assert status is not None, "the client got no final frame"
    assert not _alive(sleeper), "the command outlived the server's end"


async def _host_pid_of(cmdline: str, within: float = 10.0) -> int:
    deadline = time.monotonic() + within
    while True:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == cmdline.encode():
                    return int(entry)
        if time.monotonic() > deadline:
            raise AssertionError(f"no process runs {cmdline!r} after {within:.0f} s")
        await asyncio.sleep(0.01)
