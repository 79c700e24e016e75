"""Stand-in upstream servers on 127.0.0.1 with their own test CA (tests and bench).

- ``git``: git smart HTTP (``git http-backend``) that demands
  ``Basic base64(x-access-token:TOKEN)``, as github.com's git endpoint does;
- ``echo``: answers JSON with the Authorization and Host it received;
- ``download``: ``GET /bytes/N`` streams N bytes;
- ``sink`` (:func:`start_sink`): HTTP/1.1 with keep-alive and ``Expect:
  100-continue``; hashes each request body as it streams in and answers JSON
  with its sha256, length, framing and trailers.

Every request's headers are recorded in ``seen`` so tests can prove where the
token went.  Servers run in daemon threads of the test process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


@dataclass
class Upstream:
    """A running stand-in server."""

    kind: str
    port: int
    server: ThreadingHTTPServer
    seen: list[dict[str, Any]] = field(default_factory=list)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def make_handler(kind: str, seen: list[dict[str, Any]], token: str | None,
                 git_root: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self) -> None:
            seen.append({"method": self.command, "path": self.path,
                         "headers": [(k, v) for k, v in self.headers.items()]})

        def do_GET(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def _handle(self) -> None:
            self._record()
            if kind == "echo":
                body = _read_body(self)
                reply = json.dumps({
                    "authorization": self.headers.get_all("Authorization") or [],
                    "host": self.headers.get("Host"),
                    "path": self.path,
                    "body_length": len(body),
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            elif kind == "download":
                size = int(self.path.rsplit("/", 1)[-1])
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                block = b"x" * CHUNK
                while size > 0:
                    n = min(size, CHUNK)
                    self.wfile.write(block[:n])
                    size -= n
            else:
                self._git()

        def _git(self) -> None:
            want = "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="stand-in github"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(git_root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REMOTE_USER": "x-access-token",
                "REMOTE_ADDR": "127.0.0.1",
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "http.receivepack",
                "GIT_CONFIG_VALUE_0": "true",
            }
            body = _read_body(self) if self.command == "POST" else b""
            env["CONTENT_LENGTH"] = str(len(body))
            proc = subprocess.run(["git", "http-backend"], input=body, env=env,
                                  capture_output=True, check=False)
            head, _, out = proc.stdout.partition(b"\r\n\r\n")
            status = 200
            headers = []
            for line in head.split(b"\r\n"):
                name, _, value = line.decode().partition(":")
                if name.lower() == "status":
                    status = int(value.strip().split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(out)

    return Handler


class SinkHandler(BaseHTTPRequestHandler):
    """The ``sink``: every body hashed in 1 MiB reads, never held whole.

    Its ``100 Continue`` carries ``X-Upstream: sink`` so a test can tell it from
    one the proxy made up.  ``/refuse`` answers a final 413 instead of 100.
    """

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_expect_100(self) -> bool:
        if self.path.startswith("/refuse"):
            self._reply(413, {"refused": True}, close=True)
            return False
        self.send_response_only(100)
        self.send_header("X-Upstream", "sink")
        self.end_headers()
        return True

    def do_GET(self) -> None:
        self._hash()

    def do_POST(self) -> None:
        self._hash()

    def do_PUT(self) -> None:
        self._hash()

    def _hash(self) -> None:
        digest = hashlib.sha256()
        trailers: list[tuple[str, str]] = []
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        if chunked:
            length = self._chunked(digest, trailers)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            left = length
            while left > 0:
                piece = self.rfile.read(min(left, CHUNK))
                if not piece:
                    raise ConnectionError("the body ended early")
                digest.update(piece)
                left -= len(piece)
        record = {"method": self.command, "path": self.path, "sha256": digest.hexdigest(),
                  "length": length, "chunked": chunked, "trailers": trailers,
                  "headers": [(k, v) for k, v in self.headers.items()]}
        self.seen.append(record)
        self._reply(200, {k: v for k, v in record.items() if k != "headers"})

    def _chunked(self, digest: Any, trailers: list[tuple[str, str]]) -> int:
        length = 0
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode().partition(":")
                    trailers.append((name.strip(), value.strip()))
                return length
            while size > 0:
                piece = self.rfile.read(min(size, CHUNK))
                if not piece:
                    raise ConnectionError("the body ended early")
                digest.update(piece)
                size -= len(piece)
                length += len(piece)
            self.rfile.readline()

    def _reply(self, status: int, answer: dict[str, Any], close: bool = False) -> None:
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


def start_sink(cert_pem: str | None, key_pem: str | None) -> Upstream:
    """Start a ``sink`` on 127.0.0.1 (a free port); TLS unless cert_pem is None."""
    seen: list[dict[str, Any]] = []
    handler = type("Sink", (SinkHandler,), {"seen": seen})
    return _serve("sink", handler, seen, cert_pem, key_pem)


def start(kind: str, cert_pem: str | None, key_pem: str | None, token: str | None = None,
          git_root: str | None = None) -> Upstream:
    """Start a stand-in on 127.0.0.1 (a free port); TLS unless cert_pem is None."""
    seen: list[dict[str, Any]] = []
    return _serve(kind, make_handler(kind, seen, token, git_root), seen, cert_pem, key_pem)


def _serve(kind: str, handler: type[BaseHTTPRequestHandler], seen: list[dict[str, Any]],
           cert_pem: str | None, key_pem: str | None) -> Upstream:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if cert_pem is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_pem, key_pem)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return Upstream(kind, server.server_address[1], server, seen)


def bare_repo(root: Path, name: str = "repo.git") -> Path:
    """A bare repository with one commit, under ``root``."""
    work = root / "seed"
    bare = root / name
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text("hello\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "seed"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    return bare


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HTTP_OK = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"


def serve_once(ctx: ssl.SSLContext, reply: bytes) -> tuple[int, threading.Thread]:
    """A TLS server on loopback that takes one connection, reads once and sends ``reply``;
    a failed handshake just ends it (the client's side is what a test checks)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        with server:
            server.settimeout(10)
            conn, _ = server.accept()
            with conn:
                try:
                    with ctx.wrap_socket(conn, server_side=True) as tls:
                        tls.recv(4096)
                        tls.sendall(reply)
                except (ssl.SSLError, OSError):
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread
