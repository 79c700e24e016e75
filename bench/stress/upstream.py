"""Stand-in servers on loopback for the proxy parts, run as their own process.

    python3 upstream.py CERT KEY RECORD

Prints one JSON line of ports, then serves until killed:

- ``echo``: TCP echo (the tunnels' far end);
- ``tls``: HTTP/1.1 over TLS (the cert names github.com, api.github.com and
  other.stress.test), keep-alive; ``plain``: the same without TLS.  Paths:
  ``/small`` answers a few bytes naming a hash of the Authorization received
  (never the value: the client must not learn the token from us);
  ``/redirect`` sends a 302 to https://other.stress.test/landing;
  ``/reset`` promises 1 MiB, sends 64 KiB and resets the connection;
- ``canary``: accepts and counts (on 127.0.0.1 and ::1): nothing should ever
  reach it through the proxy.

Every request and every canary accept is appended to RECORD as a JSON line,
Authorization values included, so the suite can prove where a token went.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import ssl
import struct
import sys
from typing import Any, TextIO


def auth_tag(value: str | None) -> str:
    """What /small reports about the Authorization it got."""
    if value is None:
        return "none"
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class Recorder:
    def __init__(self, fh: TextIO) -> None:
        self.fh = fh

    def write(self, **entry: Any) -> None:
        self.fh.write(json.dumps(entry) + "\n")
        self.fh.flush()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport = writer.transport
    transport.abort()


def http_handler(rec: Recorder, name: str):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = [tuple(x.strip() for x in line.split(":", 1))
                           for line in lines[1:] if ":" in line]
                auths = [v for k, v in headers if k.lower() == "authorization"]
                hosts = [v for k, v in headers if k.lower() == "host"]
                length = sum(int(v) for k, v in headers if k.lower() == "content-length")
                if length:
                    await reader.readexactly(length)
                rec.write(server=name, method=method, path=path, host=hosts,
                          authorization=auths)
                if path.startswith("/reset"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n")
                    writer.write(b"r" * 65536)
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    _reset(writer)
                    return
                if path.startswith("/redirect"):
                    body = b"moved\n"
                    writer.write(b"HTTP/1.1 302 Found\r\nLocation: https://other.stress.test/"
                                 b"landing\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                else:
                    tag = auth_tag(auths[0] if len(auths) == 1 else
                                   (None if not auths else "|".join(auths)))
                    body = f"{name} auth={tag} n={len(auths)}\n".encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError,
                ssl.SSLError):
            pass
        finally:
            writer.close()
    return handle


def canary_handler(rec: Recorder):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rec.write(server="canary", peer=str(writer.get_extra_info("peername")))
        writer.close()
    return handle


async def main(cert: str, key: str, record: str) -> None:
    fh = open(record, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    rec = Recorder(fh)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ports: dict[str, int] = {}
    servers = []
    srv = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=4096)
    servers.append(srv)
    ports["echo"] = srv.sockets[0].getsockname()[1]
    srv = await asyncio.start_server(http_handler(rec, "tls"), "127.0.0.1", 0, ssl=ctx,
                                     backlog=1024)
    servers.append(srv)
    ports["tls"] = srv.sockets[0].getsockname()[1]
    srv = await asyncio.start_server(http_handler(rec, "plain"), "127.0.0.1", 0, backlog=1024)
    servers.append(srv)
    ports["plain"] = srv.sockets[0].getsockname()[1]
    srv = await asyncio.start_server(canary_handler(rec), "127.0.0.1", 0)
    servers.append(srv)
    ports["canary"] = srv.sockets[0].getsockname()[1]
    # The same port on ::1, so every IPv6 spelling of loopback has a target too.
    with contextlib.suppress(OSError):
        servers.append(await asyncio.start_server(canary_handler(rec), "::1", ports["canary"]))
    sys.stdout.write(json.dumps(ports) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
