"""A stand-in for Claude's OAuth token endpoint and API, on loopback, over TLS.

One HTTPS server answers for ``platform.claude.com`` (the token endpoint,
``POST /v1/oauth/token``) and ``api.anthropic.com`` (Messages, through
standin_apis' script).  It holds one login as the real service would:

- the API takes only a current access token (``Authorization: Bearer``, with
  ``anthropic-beta: oauth-2025-04-20``), else 401;
- a refresh with the current refresh token and Claude Code's client id issues
  a new pair and revokes the old one (the refresh token rotates); anything
  else is ``400 invalid_grant``;
- every request is recorded (host, path, headers, body) for the tests, and
  each rotation calls ``on_refresh`` when set.
"""

from __future__ import annotations

import json
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trustme
from standin_apis import anthropic_json, anthropic_stream

HOSTS = ("api.anthropic.com", "platform.claude.com", "console.anthropic.com")
CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"


@dataclass
class Request:
    host: str
    path: str
    headers: str  # every header, as sent
    body: str


@dataclass
class Oauth:
    port: int
    ca_file: Path
    access: str = field(default_factory=lambda: f"sk-ant-oat01-real-{uuid.uuid4().hex}")
    refresh: str = field(default_factory=lambda: f"sk-ant-ort01-real-{uuid.uuid4().hex}")
    issued: list[tuple[str, str]] = field(default_factory=list)  # every pair, oldest first
    seen: list[Request] = field(default_factory=list)
    on_refresh: Callable[[], None] | None = None  # called after each rotation
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.issued.append((self.access, self.refresh))

    def refreshes(self) -> list[Request]:
        return [r for r in self.seen if r.path == "/v1/oauth/token"]

    def secrets(self) -> list[str]:
        return [t for pair in self.issued for t in pair]


def _handler(o: Oauth) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _reply(self, status: int, data: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self) -> bytes:
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""
            o.seen.append(Request(self.headers.get("Host", ""), self.path.split("?")[0],
                                  str(self.headers), raw.decode("utf-8", "replace")))
            return raw

        def do_GET(self) -> None:
            self._record()
            self._reply(404, b'{"error":{"message":"not here"}}')

        def do_POST(self) -> None:
            raw = self._record()
            path = self.path.split("?")[0]
            if path == "/v1/oauth/token":
                self._token(raw)
            elif path.endswith("/v1/messages"):
                self._messages(raw)
            else:
                self._reply(404, b'{"error":{"message":"not here"}}')

        def _token(self, raw: bytes) -> None:
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            with o.lock:
                good = (body.get("grant_type") == "refresh_token"
                        and body.get("client_id") == CLIENT_ID
                        and body.get("refresh_token") == o.refresh)
                if good:  # rotate: the old pair is revoked
                    o.access = f"sk-ant-oat01-real-{uuid.uuid4().hex}"
                    o.refresh = f"sk-ant-ort01-real-{uuid.uuid4().hex}"
                    o.issued.append((o.access, o.refresh))
                    answer = {"access_token": o.access, "refresh_token": o.refresh,
                              "expires_in": 28800, "token_type": "Bearer",
                              "scope": body.get("scope", "user:inference")}
            if not good:
                self._reply(400, b'{"error":"invalid_grant"}')
                return
            if o.on_refresh is not None:
                o.on_refresh()
            self._reply(200, json.dumps(answer).encode())

        def _messages(self, raw: bytes) -> None:
            auth = self.headers.get("Authorization", "")
            beta = self.headers.get("anthropic-beta", "")
            if auth != f"Bearer {o.access}" or "oauth-2025-04-20" not in beta:
                self._reply(401, json.dumps({"type": "error", "error": {
                    "type": "authentication_error", "message": "Invalid bearer token"}}).encode())
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            if body.get("stream"):
                self._reply(200, anthropic_stream(body), "text/event-stream")
            else:
                self._reply(200, anthropic_json(body))

    return Handler


def start(tmp: Path) -> tuple[Oauth, ThreadingHTTPServer]:
    ca = trustme.CA()
    cert = ca.issue_cert(*HOSTS, "localhost", "127.0.0.1")
    ca_file = tmp / "oauth-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    o = Oauth(port=0, ca_file=ca_file)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(o))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    o.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return o, server
