"""The launcher's end-to-end world: a test home, stand-in GitHub hosts, a config.

Helpers only; the fixtures are in conftest.py.

Everything is real and on loopback: a TLS stand-in for github.com and
api.github.com (its own trustme CA, on 127.0.0.1, reached by the proxy through
the config's ``resolve`` pins and ``upstream_ca``) that echoes the
Authorization header it received; a temporary HOME holding a fake
``~/.ssh/id_rsa`` and the token file the token command reads; a temporary
XDG_RUNTIME_DIR, so that the test can see every socket a session leaves.
"""

from __future__ import annotations

import _socket
import contextlib
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme

# Unique per run: a literal would also be found in this very file when the
# checkout lives under a directory the probe searches (/tmp in some CI clones).
TOKEN = "tok-" + secrets.token_hex(8) + "-launcher-SECRET"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- launcher-test-secret"


@dataclass
class StandIn:
    port: int
    ca_file: Path
    seen: list[dict[str, Any]] = field(default_factory=list)
    # Every TLS handshake the stand-in began: (time, SNI), for a failure's message.
    handshakes: list[tuple[float, str | None]] = field(default_factory=list)
    # Every connection its serving loop accepted (the TLS handshake is part of
    # the accept): (time, "from port N" or the handshake's error).
    accepts: list[tuple[float, str]] = field(default_factory=list)
    fd: int = -1  # its listening socket's descriptor in this process


@dataclass
class World:
    root: Path
    home: Path
    workdir: Path
    runtime_parent: Path  # XDG_RUNTIME_DIR: sessions live in agent-sandbox/ below
    standin: StandIn
    mark: str  # in every launcher's environment: finds leftovers in /proc

    def config(self, name: str = "config.toml", **extra: object) -> Path:
        """A config file pinning the stand-in; ``extra`` keys added or replaced."""
        keys: dict[str, object] = {
            "workdir": str(self.workdir),
            "token_command": f"cat {self.home}/.config/token",
            "resolve": [
                f"github.com:127.0.0.1:{self.standin.port}",
                f"api.github.com:127.0.0.1:{self.standin.port}",
            ],
            "upstream_ca": str(self.standin.ca_file),
            "start_timeout": 60,
        }
        keys.update(extra)
        path = self.root / name
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("XDG_", "AGENT_SANDBOX", "GNUPG", "GIT_"))
        }
        env.update(HOME=str(self.home), XDG_RUNTIME_DIR=str(self.runtime_parent))
        env["AS_TEST_MARK"] = self.mark
        env.update(extra)
        return env

    def launch(
        self, *cmd: str, config: Path | None = None, sandbox: str = "bwrap", **kw: Any
    ) -> subprocess.Popen[str]:
        argv = ["agent-sandbox", "run", f"--config={config or self.config()}"]
        argv += [f"--sandbox={sandbox}", "--", *cmd]
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdin", subprocess.DEVNULL)
        env = kw.pop("env", None) or self.env()
        kw.setdefault("text", True)
        kw.setdefault("cwd", str(self.workdir))  # where the person stands
        return subprocess.Popen(argv, env=env, **kw)

    def run(self, *cmd: str, timeout: float = 90, **kw: Any) -> subprocess.CompletedProcess[str]:
        proc = self.launch(*cmd, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def leftovers(self) -> list[str]:
        """Processes still carrying this world's mark, and sockets left behind."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if self.mark.encode() in environ or self.mark.encode() in cmdline:
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"pid {pid}: {shown}")
        sessions = self.runtime_parent / "agent-sandbox"
        if sessions.exists():
            found += [f"runtime entry {p}" for p in sessions.iterdir()]
        return found


def _echo_handler(seen: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            record = {
                "host": self.headers.get("Host"),
                "path": self.path,
                "authorization": self.headers.get_all("Authorization") or [],
            }
            seen.append(record)
            body = json.dumps(record).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler



def make_world(root: Path, standin: StandIn) -> World:
    """A fresh test home (with an ssh key and the token file), workdir and runtime dir."""
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SSH_KEY + "\n")
    (home / ".config").mkdir()
    (home / ".config" / "token").write_text(TOKEN + "\n")
    workdir = root / "work"
    workdir.mkdir()
    # Short, so that the session's sockets fit in sun_path and land here
    # (a deep path makes the launcher fall back to /tmp, out of our sight).
    rt = Path(tempfile.mkdtemp(prefix="as-rt-", dir="/tmp"))
    return World(root, home, workdir, rt, standin, mark=f"as-mark-{uuid.uuid4().hex}")


def kill_leftovers(w: World) -> None:
    """Kill whatever a failed test left behind; remove the runtime parent."""
    for line in w.leftovers():
        if line.startswith("pid "):
            with contextlib.suppress(OSError):
                os.kill(int(line.split()[1].rstrip(":")), 9)
    # A launcher killed and its janitor killed here too leave the live gate's mounts:
    # released as the next start would (libbroker.launcher.hostrun_binds).
    from libbroker.launcher.hostrun_binds import release

    for record in w.runtime_parent.glob("**/binds.json"):
        release(str(record.parent))
    shutil.rmtree(w.runtime_parent, ignore_errors=True)


def start_standin(tmp: Path) -> tuple[StandIn, ThreadingHTTPServer]:
    ca = trustme.CA()
    cert = ca.issue_cert("github.com", "api.github.com")
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    seen: list[dict[str, Any]] = []
    handshakes: list[tuple[float, str | None]] = []
    accepts: list[tuple[float, str]] = []
    ctx.sni_callback = lambda _obj, name, _ctx: handshakes.append((time.time(), name))

    class Server(ThreadingHTTPServer):
        def get_request(self) -> tuple[Any, Any]:
            try:
                conn, addr = super().get_request()
            except OSError as exc:  # swallowed by the serving loop: kept for a failure
                accepts.append((time.time(), f"failed: {exc}"))
                raise
            accepts.append((time.time(), f"from port {addr[1]}"))
            return conn, addr

    server = Server(("127.0.0.1", 0), _echo_handler(seen))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return StandIn(port=server.server_address[1], ca_file=ca_file, seen=seen,
                   handshakes=handshakes, accepts=accepts, fd=server.fileno()), server


def who_accepts(standin: StandIn) -> list[str]:
    """Who could accept on the stand-in's port, for a failure's message (costs ~0.1 s).

    A certificate its CA did not sign, from its port, and no handshake of its
    own: another acceptor of that listening socket answered.  Named here: each
    process holding a socket listening on 127.0.0.1:PORT (/proc/net/tcp's
    inode in /proc/*/fd), and each server object of this process whose
    descriptor is the stand-in's (a descriptor closed under another server and
    reused by the stand-in's socket).
    """
    import gc
    import socketserver

    local = f"0100007F:{standin.port:04X}"
    inodes = set()
    with contextlib.suppress(OSError):
        for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[1] == local and cols[3] == "0A":  # LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    found = [f"listening on {local}: {sorted(inodes) or 'nothing'}"]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        comm = Path(f"/proc/{pid}/comm").read_text().strip()
                        found.append(f"held by pid {pid} ({comm}) fd {fd}"
                                     + (" (this process)" if int(pid) == os.getpid() else ""))
    for obj in gc.get_objects():
        with contextlib.suppress(Exception):  # an object half made or gone: not ours
            if isinstance(obj, socketserver.BaseServer) and obj.fileno() == standin.fd:
                whose = "the stand-in" if obj.server_address[1] == standin.port else "ANOTHER"
                found.append(f"server on the stand-in's fd {standin.fd} ({whose}): {obj!r} "
                             f"{obj.server_address}")
            elif isinstance(obj, _socket.socket) and obj.fileno() == standin.fd:
                # (_socket.socket: the raw ones too, as libbroker's bridge and door use)
                found.append(f"socket object on the stand-in's fd {standin.fd}: {obj!r}")
    return found
