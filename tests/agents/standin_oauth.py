"""Stand-ins for Claude's and ChatGPT's OAuth token endpoints and APIs, on loopback, TLS.

One HTTPS server answers for ``platform.claude.com`` (Claude's token
endpoint, ``POST /v1/oauth/token``), ``api.anthropic.com`` (Messages),
``auth.openai.com`` (Codex's, ``POST /oauth/token``) and ``chatgpt.com``
(``/backend-api/codex/responses``), ``oauth2.googleapis.com`` (Gemini CLI's
``/token`` and ``/tokeninfo``), ``cloudcode-pa.googleapis.com`` (Code Assist)
and ``www.googleapis.com`` (userinfo), the models through standin_apis' script.
It holds one login of the kind asked for, as the real service would:

- the API takes only the current access token (``Authorization: Bearer``;
  Claude: with ``anthropic-beta: oauth-2025-04-20``; Codex: with the
  account's ``chatgpt-account-id``), else 401;
- a refresh with the current refresh token and the agent's client id, or
  the exchange of its one authorization code (``code``, with a verifier: a
  ``/login``), issues a new pair (Codex: JWT access and id tokens, with ``exp``) and revokes the
  old one (the refresh token rotates; Google's does not, and its access
  tokens stay valid until they expire); anything else is ``400 invalid_grant``;
- every request is recorded (host, path, headers, body) for the tests, and
  each rotation calls ``on_refresh`` when set.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl

import trustme
from agents_world import Home
from standin_apis import anthropic_json, anthropic_stream, gemini_chunk, openai_stream

HOSTS = ("api.anthropic.com", "platform.claude.com", "console.anthropic.com",
         "auth.openai.com", "chatgpt.com",
         "oauth2.googleapis.com", "cloudcode-pa.googleapis.com", "www.googleapis.com")
GEMINI_CLIENT_ID = "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com"
CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
CODEX_CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
ACCOUNT = "acct-standin-1"
CLAUDE_ACCOUNT = "claude-account-standin-1"  # Claude's token answers name their account
# gcloud's public client id, and its own ADC login (in the session: the person's choice)
GCLOUD_CLIENT_ID = "32555940559.apps.googleusercontent.com"
GCLOUD_REFRESH = "1//gcloud-own-refresh"
GCLOUD_ACCESS = "ya29.gcloud-own-access"


def jwt(claims: dict[str, object], signature: str) -> str:
    """A JWT of ``claims`` (unsigned: the CLIs decode, never verify, their own tokens)."""
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.{signature}"


def codex_pair(lifetime_s: float) -> tuple[str, str, str]:
    """(id token, access token, refresh token) for the stand-in's ChatGPT account."""
    mark = uuid.uuid4().hex
    auth = {"chatgpt_plan_type": "plus", "chatgpt_user_id": "user-standin",
            "chatgpt_account_id": ACCOUNT}
    exp = int(time.time() + lifetime_s)
    id_token = jwt({"email": "p@example.com", "https://api.openai.com/auth": auth, "exp": exp},
                   f"idsig-real-{mark}")
    access = jwt({"https://api.openai.com/auth": auth, "exp": exp}, f"sig-real-{mark}")
    return id_token, access, f"rt_real-{mark}"


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
    kind: str = "claude"
    access: str = field(default_factory=lambda: f"sk-ant-oat01-real-{uuid.uuid4().hex}")
    refresh: str = field(default_factory=lambda: f"sk-ant-ort01-real-{uuid.uuid4().hex}")
    id_token: str = ""
    lifetime_s: float = 28800  # of the tokens a refresh issues
    issued: list[tuple[str, str]] = field(default_factory=list)  # every pair, oldest first
    seen: list[Request] = field(default_factory=list)
    on_refresh: Callable[[], None] | None = None  # called after each rotation
    code: str = field(default_factory=lambda: f"code-{uuid.uuid4().hex}")  # one, for a /login
    account: str = CLAUDE_ACCOUNT  # whose login a code exchange gives (Claude's; Google's sub)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.issued.append((self.access, self.refresh))

    def codex(self, lifetime_s: float) -> None:
        """Hold a ChatGPT login instead, its access token valid ``lifetime_s`` more."""
        self.kind = "codex"
        self.id_token, self.access, self.refresh = codex_pair(lifetime_s)
        self.issued = [(self.access, self.refresh)]

    def gemini(self) -> None:
        """Hold a Google login instead (Gemini CLI's; the refresh token does not rotate)."""
        self.kind = "gemini"
        self.access = f"ya29.real-{uuid.uuid4().hex}"
        self.refresh = f"1//real-{uuid.uuid4().hex}"
        self.issued = [(self.access, self.refresh)]

    def exchanged(self, body: dict[str, object], client: str) -> bool:
        """Whether ``body`` exchanges the stand-in's one authorization code (then spent)."""
        if body.get("grant_type") != "authorization_code" or body.get("client_id") != client \
                or body.get("code") != self.code or not body.get("code_verifier"):
            return False
        self.code = f"spent-{uuid.uuid4().hex}"
        return True

    def refreshes(self) -> list[Request]:
        return [r for r in self.seen if r.path in ("/v1/oauth/token", "/oauth/token", "/token")]

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
            if self.path.split("?")[0] == "/oauth2/v2/userinfo" and self._authorized():
                self._reply(200, b'{"id": "1", "email": "p@example.com"}')
                return
            if self.path.split("?")[0] == "/backend-api/codex/responses":
                # Codex asks for the Responses WebSocket first: the stand-in has none.
                # 426 makes it use HTTPS at once (a 404 costs its five reconnects with
                # their back-off, about 6.5 s of every turn).
                self._reply(426, b'{"error":{"message":"no WebSocket here"}}')
                return
            if self.path.split("?")[0] == "/backend-api/wham/accounts/check":
                # Codex asks where the account's backend is before each turn.
                entry = {"id": ACCOUNT, "workspace_backend_origin": "https://chatgpt.com",
                         "account_routing_override": "NO_CONSTRAINT"}
                self._reply(200, json.dumps({"accounts": [entry],
                                             "account_ordering": [ACCOUNT]}).encode())
                return
            self._reply(404, b'{"error":{"message":"not here"}}')

        def do_POST(self) -> None:
            raw = self._record()
            path = self.path.split("?")[0]
            if path == "/token":
                self._google_token(raw)
            elif path == "/tokeninfo":
                self._tokeninfo()
            elif path.startswith("/v1internal:"):
                self._code_assist(path, raw)
            elif path in ("/v1/oauth/token", "/oauth/token"):
                self._token(raw)
            elif path.endswith("/v1/messages") or path.endswith("/codex/responses"):
                self._messages(raw)
            else:
                self._reply(404, b'{"error":{"message":"not here"}}')

        def _token(self, raw: bytes) -> None:
            try:
                body = json.loads(raw)
            except ValueError:  # Codex sends its code exchange as a form
                body = dict(parse_qsl(raw.decode("ascii", "replace")))
            client = CODEX_CLIENT_ID if o.kind == "codex" else CLIENT_ID
            answer: dict[str, object] = {}
            with o.lock:
                good = (body.get("grant_type") == "refresh_token"
                        and body.get("client_id") == client
                        and body.get("refresh_token") == o.refresh) or o.exchanged(body, client)
                if good and o.kind == "codex":  # rotate: the old pair is revoked
                    o.id_token, o.access, o.refresh = codex_pair(o.lifetime_s)
                    answer = {"id_token": o.id_token, "access_token": o.access,
                              "refresh_token": o.refresh}
                elif good:
                    o.access = f"sk-ant-oat01-real-{uuid.uuid4().hex}"
                    o.refresh = f"sk-ant-ort01-real-{uuid.uuid4().hex}"
                    answer = {"access_token": o.access, "refresh_token": o.refresh,
                              "expires_in": int(o.lifetime_s), "token_type": "Bearer",
                              "scope": body.get("scope", "user:inference"),
                              "account": {"uuid": o.account,
                                          "email_address": "p@example.com"}}
                if good:
                    o.issued.append((o.access, o.refresh))
            if not good:
                self._reply(400, b'{"error":"invalid_grant"}')
                return
            if o.on_refresh is not None:
                o.on_refresh()
            self._reply(200, json.dumps(answer).encode())

        def _authorized(self) -> bool:
            """Google's way: an access token stays valid until it expires, refresh or not
            (each of the proxy's hosts takes up the new one within a keeper's period)."""
            auth = self.headers.get("Authorization", "")
            return any(auth == f"Bearer {a}" for a, _ in o.issued)

        def _google_token(self, raw: bytes) -> None:
            form = dict(parse_qsl(raw.decode("ascii", "replace")))
            with o.lock:
                if form.get("client_id") == GCLOUD_CLIENT_ID:  # gcloud's own ADC refresh
                    good = form.get("refresh_token") == GCLOUD_REFRESH
                    self._reply(200 if good else 400, json.dumps(
                        {"access_token": GCLOUD_ACCESS, "expires_in": 3599} if good
                        else {"error": "invalid_grant"}).encode())
                    return
                code = o.exchanged(form, GEMINI_CLIENT_ID)
                good = code or (form.get("grant_type") == "refresh_token"
                                and form.get("client_id") == GEMINI_CLIENT_ID
                                and form.get("client_secret", "").startswith("GOCSPX-")
                                and form.get("refresh_token") == o.refresh)
                if code:  # a new login: a new refresh token too
                    o.refresh = f"1//real-{uuid.uuid4().hex}"
                if good:  # a new access token; Google keeps the refresh token
                    o.access = f"ya29.real-{uuid.uuid4().hex}"
                    o.issued.append((o.access, o.refresh))
            if not good:
                self._reply(400, b'{"error":"invalid_grant"}')
                return
            if o.on_refresh is not None:
                o.on_refresh()
            answer = {"access_token": o.access, "expires_in": int(o.lifetime_s),
                      "token_type": "Bearer",
                      "scope": "https://www.googleapis.com/auth/cloud-platform"}
            if code:  # a new login: its refresh token, and who it is (openid email scopes)
                answer["refresh_token"] = o.refresh
                answer["id_token"] = jwt({"sub": o.account, "email": "p@example.com"},
                                         f"idsig-{uuid.uuid4().hex}")
            self._reply(200, json.dumps(answer).encode())

        def _tokeninfo(self) -> None:
            if not self._authorized():
                self._reply(400, b'{"error":"invalid_token"}')
                return
            self._reply(200, json.dumps({
                "expires_in": 3000, "email": "p@example.com", "aud": GEMINI_CLIENT_ID,
                "scope": "https://www.googleapis.com/auth/cloud-platform"}).encode())

        def _code_assist(self, path: str, raw: bytes) -> None:
            if not self._authorized():
                self._reply(401, b'{"error":{"code":401,"message":"invalid credentials"}}')
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            method = path.split(":", 1)[1]
            if method == "loadCodeAssist":
                answer: dict[str, object] = {
                    "currentTier": {"id": "standard-tier", "name": "Standard"},
                    "cloudaicompanionProject": "standin-project"}
            elif method == "onboardUser":
                answer = {"done": True, "response": {
                    "cloudaicompanionProject": {"id": "standin-project"}}}
            elif method == "countTokens":
                answer = {"totalTokens": 10}
            elif method in ("streamGenerateContent", "generateContent"):
                chunk = {"response": gemini_chunk(body.get("request") or {})}
                if method == "generateContent":
                    answer = chunk
                else:
                    data = b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"
                    self._reply(200, data, "text/event-stream")
                    return
            else:
                answer = {}
            self._reply(200, json.dumps(answer).encode())

        def _messages(self, raw: bytes) -> None:
            auth = self.headers.get("Authorization", "")
            if o.kind == "codex":
                login = self.headers.get("chatgpt-account-id", "") == ACCOUNT
            else:
                login = "oauth-2025-04-20" in self.headers.get("anthropic-beta", "")
            if auth != f"Bearer {o.access}" or not login:
                self._reply(401, json.dumps({"type": "error", "error": {
                    "type": "authentication_error", "message": "Invalid bearer token"}}).encode())
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            if o.kind == "codex":
                self._reply(200, openai_stream(body), "text/event-stream")
            elif body.get("stream"):
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
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return o, server


@contextlib.contextmanager
def serving(tmp: Path) -> Iterator[Oauth]:
    """The stand-in token endpoints and APIs for one test, shut down after it."""
    found, server = start(tmp)
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def comes_due(flag: Path, creds: Path, expire: Callable[[dict[str, object]], None],
              timeout: float = 150) -> threading.Thread:
    """Once the session touches ``flag``, the person's login comes due: ``expire`` moves
    its expiry inside the keeper's margin, written as the keeper writes (the directory
    locked, a temporary file renamed over it, the mode kept).  The keeper reads the file
    at each run and compares that expiry with the clock: this is the token coming due
    mid-session at the moment the test chooses (no fixed wait, no race with the turn
    before it).  The thread ends by itself; join it after the session."""
    def wait_then_expire() -> None:
        deadline = time.monotonic() + timeout
        while not flag.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        dirfd = os.open(creds.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(dirfd, fcntl.LOCK_EX)
            data = json.loads(creds.read_text())
            expire(data)
            tmp = creds.parent / f".{creds.name}.due"
            tmp.write_text(json.dumps(data))
            tmp.chmod(creds.stat().st_mode & 0o777)
            os.replace(tmp, creds)
        finally:
            os.close(dirfd)

    thread = threading.Thread(target=wait_then_expire, daemon=True)
    thread.start()
    return thread


def run_logged_in(w: Home, o: Oauth, backend: str, agent: str, key_var: str, script: str,
                  timeout: float, **keys: object) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in a session of ``agent`` whose only login is its OAuth file:
    the hosts pinned to the stand-in, the keeper's cycle shortened to 1 s, and the
    agent's exported key (``key_var``) removed; ``keys``: more config keys."""
    cfg = w.config(resolve=[f"{h}:127.0.0.1:{o.port}" for h in HOSTS],
                   upstream_ca=str(o.ca_file), **keys)
    env = w.env(AGENT_SANDBOX_LOGIN_EVERY="1")
    env.pop(key_var)  # the login alone
    argv = ["agent-sandbox", "run", f"--config={cfg}", f"--sandbox={backend}",
            f"--agent={agent}", "--", "sh", "-c", script]
    return subprocess.run(argv, env=env, cwd=w.workdir, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)
