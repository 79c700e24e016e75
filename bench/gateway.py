"""egress-proxy gateway benchmark: requests per second through one tenant vs one session.

Two real egress-proxy processes in the same run: the single-session mode
(``--allow``, the same-uid loopback check) and the gateway (``--control``, one
tenant with the same allow list, its credential on every request).  Against a
small HTTP stand-in on loopback, with GATEWAY_BENCH_CLIENTS concurrent clients
for GATEWAY_BENCH_SECONDS per round (rounds interleaved, median reported):

1. plain HTTP, kept alive: one request after another on each connection
   (the gateway checks the credential on every request);
2. CONNECT, a new connection per request (credential check per connection,
   vs the peer lookup in the kernel's socket table);
3. SOCKS5, a new connection per request (RFC 1929 vs no authentication).

Prints requests per second for each mode and the ratio gateway / session.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "egress"))
sys.path.insert(0, str(REPO))
from egress_proxyproc import ProxyProc, start_proxy  # noqa: E402

from libegress.control import control_request  # noqa: E402
from libegress.proxyauth import userpass_request  # noqa: E402

CLIENTS = int(os.environ.get("GATEWAY_BENCH_CLIENTS", "16"))
SECONDS = float(os.environ.get("GATEWAY_BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("GATEWAY_BENCH_ROUNDS", "3"))
HOST = "bench.test"
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def start_upstream() -> int:
    """A keep-alive HTTP/1.1 stand-in on its own thread and loop; its port."""
    ready: list[int] = []
    started = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        ready.append(server.sockets[0].getsockname()[1])
        started.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    started.wait(10)
    return ready[0]


async def _read_reply(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:60]!r}")
    await reader.readexactly(2)


def plain(proxy: ProxyProc, port: int, auth: bytes) -> Callable[[float], Awaitable[int]]:
    request = (f"GET http://{HOST}:{port}/ HTTP/1.1\r\nHost: {HOST}:{port}\r\n".encode()
               + auth + b"\r\n")

    async def run(deadline: float) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        done = 0
        while time.monotonic() < deadline:
            writer.write(request)
            await _read_reply(reader)
            done += 1
        writer.close()
        return done
    return run


def connect(proxy: ProxyProc, port: int, auth: bytes) -> Callable[[float], Awaitable[int]]:
    head = (f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n".encode()
            + auth + b"\r\n")

    async def run(deadline: float) -> int:
        done = 0
        while time.monotonic() < deadline:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(head)
            answer = await reader.readuntil(b"\r\n\r\n")
            if not answer.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"CONNECT refused: {answer[:60]!r}")
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await _read_reply(reader)
            writer.close()
            done += 1
        return done
    return run


def socks(proxy: ProxyProc, port: int,
          userpass: tuple[str, str] | None) -> Callable[[float], Awaitable[int]]:
    assert proxy.socks is not None
    socks_port = int(proxy.socks.rsplit(":", 1)[1])
    name = HOST.encode()
    request = bytes([5, 1, 0, 3, len(name)]) + name + port.to_bytes(2, "big")

    async def run(deadline: float) -> int:
        done = 0
        while time.monotonic() < deadline:
            reader, writer = await asyncio.open_connection("127.0.0.1", socks_port)
            if userpass is None:
                writer.write(b"\x05\x01\x00")
                await reader.readexactly(2)
            else:
                writer.write(b"\x05\x01\x02")
                await reader.readexactly(2)
                writer.write(userpass_request(*userpass))
                if await reader.readexactly(2) != b"\x01\x00":
                    raise RuntimeError("SOCKS5 authentication refused")
            writer.write(request)
            answer = await reader.readexactly(10)
            if answer[1] != 0:
                raise RuntimeError(f"SOCKS5 refused: {answer[1]}")
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await _read_reply(reader)
            writer.close()
            done += 1
        return done
    return run


async def _rate(client: Callable[[float], Awaitable[int]]) -> float:
    started = time.monotonic()
    counts = await asyncio.gather(*(client(started + SECONDS) for _ in range(CLIENTS)))
    return sum(counts) / (time.monotonic() - started)


def main() -> int:
    upstream = start_upstream()
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    policy = [f"--allow={HOST}:{upstream}", f"--resolve={HOST}:127.0.0.1"]
    session = start_proxy(policy, socks=True)
    control = str(tmp / "control.sock")
    gateway = start_proxy(["--control", control], socks=True)
    try:
        added = control_request(control, {"op": "add", "tenant": "bench", "policy": {
            "allow": f"{HOST}:{upstream}", "resolve": [f"{HOST}:127.0.0.1"], "inject": ""}})
        assert added["ok"], added
        password = added["password"]
        auth = ("Proxy-Authorization: Basic "
                + base64.b64encode(f"bench:{password}".encode()).decode() + "\r\n").encode()
        cases = [
            ("plain HTTP, kept alive", plain(session, upstream, b""),
             plain(gateway, upstream, auth)),
            ("CONNECT, new connection each", connect(session, upstream, b""),
             connect(gateway, upstream, auth)),
            ("SOCKS5, new connection each", socks(session, upstream, None),
             socks(gateway, upstream, ("bench", password))),
        ]
        print(f"gateway bench: {CLIENTS} clients, {SECONDS:g} s x {ROUNDS} rounds "
              "(interleaved, median), requests/s")
        for name, one, many in cases:
            ones, manys = [], []
            for _ in range(ROUNDS):
                ones.append(asyncio.run(_rate(one)))
                manys.append(asyncio.run(_rate(many)))
            a, b = statistics.median(ones), statistics.median(manys)
            print(f"  {name:30s} session {a:8.0f}/s   gateway tenant {b:8.0f}/s   "
                  f"ratio {b / a:.2f}x")
    finally:
        session.stop()
        gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
