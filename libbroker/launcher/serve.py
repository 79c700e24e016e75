"""``agent-sandbox serve``: the resident per-user service (docs/serve.md).

It keeps one egress-proxy running in gateway mode (``--control``, docs/gateway.md)
and registers each session's tenant in it, so a session does not pay for an
egress-proxy interpreter of its own.  No broker is shared: a brokered command
runs on the host under its session's profile and door, so each session keeps
a broker-server of its own, forked warm by the service's zygote
(:mod:`.broker_zygote`; docs/serve.md says why).

Sessions reach the service on a unix socket: bound here (0600 under a 0177
umask, a stale one replaced) or handed over by systemd (``LISTEN_FDS``).  A
peer must be of this uid (``SO_PEERCRED``) and in this network namespace (a
bwrap sandbox has one of its own: even if the socket were in its reach, it is
refused); the peer is held by a pidfd, never looked up by its pid
(:mod:`.serve_peer`).  One connection is one session: it sends one ``session``
request (:mod:`.serve_link`), gets the gateway's ports, and the tenant lives exactly as
long as the connection; before or after it, at most one ``broker`` request (on
the session's first brokered connection).  Anything else ends the session.

When the gateway exits, the service exits (status 1): every link closes, and
every launcher ends its session.  SIGTERM and SIGINT end the service the same
way, the gateway first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import sys
import tempfile
from typing import Any

from libbroker.errors import LaunchError, UsageError
from libbroker.launcher import boot, serve_peer, warm_request
from libbroker.launcher.serve_brokers import Zygote
from libbroker.launcher.serve_conn import Closed, Conn
from libbroker.launcher.serve_link import MAX_REPLY
from libbroker.server_lines import listening_url
from libbroker.unix_listen import listen_for_service

SD_LISTEN_FDS_START = 3
START_TIMEOUT = 20.0
_KEYS = {"session": {"op", "tenant", "password", "policy", "env"},
         "broker": {"op", "env", "cwd", "umask", "socket_fd"}}


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"agent-sandbox serve: {line}\n".encode(errors="replace"))


def activated_socket(environ: dict[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed (``LISTEN_PID``/``LISTEN_FDS``), else None.

    Exactly one stream unix socket is accepted; anything else is a usage error.
    The variables are removed so that no child takes them for its own.
    """
    env = os.environ if environ is None else environ
    pid, fds = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    if not pid or not fds:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(name, None)
    if not pid.isdigit() or int(pid) != os.getpid():
        return None  # meant for another process (our parent's)
    if fds != "1":
        raise UsageError(f"LISTEN_FDS={fds}: exactly one socket is expected (the .socket unit's)")
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise UsageError(f"the activated socket (fd 3): {exc.strerror}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise UsageError("the activated socket (fd 3) is not a unix stream socket")
    sock.set_inheritable(False)
    return sock


def bind_socket(path: str) -> socket.socket:
    """Listen at ``path`` (0600 from the first moment); a stale socket there is replaced."""
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        st = os.lstat(parent)
    except OSError as exc:
        raise UsageError(f"--socket {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UsageError(f"--socket {path}: {parent} is not a directory of this user")
    sock = listen_for_service(path, _say)
    sock.setblocking(True)
    return sock


def request_frame(line: bytes) -> dict[str, Any]:
    """The checked request on ``line``; ValueError naming what is wrong.

    ``{"op": "broker", "env": {...}, "cwd": DIR, "umask": N, "socket_fd": N}``
    (with four descriptors: stdin, stdout, stderr, its listening socket) asks for
    the session's broker; ``{"op": "session", "tenant":
    NAME, "password": PASSWORD, "policy": {...}, "env": {...}}`` for its tenant.
    The gateway checks the tenant, password, policy and environment again (its
    own rules); here only the shape, so a wrong op is refused before it gets there.
    """
    try:
        frame = json.loads(line)
    except ValueError:
        raise ValueError("not a JSON object on one line") from None
    op = frame.get("op") if isinstance(frame, dict) else None
    if op == "launch":
        return warm_request.check(frame)
    if op not in _KEYS:
        raise ValueError("the requests are {\"op\": \"broker\", ...}, "
                         "{\"op\": \"session\", ...} and {\"op\": \"launch\", ...}")
    extra = sorted(set(frame) - _KEYS[op])
    if extra:
        raise ValueError(f"unknown key {extra[0]!r}")
    wanted = {"tenant": str, "password": str} if op == "session" else {
        "env": dict, "cwd": str, "umask": int, "socket_fd": int}
    for key, kind in wanted.items():
        if not isinstance(frame.get(key), kind):
            raise ValueError(f"{key!r} must be a {kind.__name__}")
    if op == "broker" and not all(isinstance(k, str) and isinstance(v, str) and "\0" not in v
                                  for k, v in frame["env"].items()):
        raise ValueError("\"env\" must map names to strings")
    checked: dict[str, Any] = frame
    return checked


class Service:
    """The gateway child, the listening socket, and one task per session."""

    def __init__(self, listener: socket.socket, workdir: str) -> None:
        self.listener = listener
        self.workdir = workdir  # 0700: the gateway's control socket
        self.control = os.path.join(workdir, "gateway.sock")
        self.gateway: asyncio.subprocess.Process | None = None
        self.http_port = 0
        self.socks_port = 0
        self.sessions = 0
        self.zygote = Zygote()
        self.launcher = Zygote("libbroker.launcher.launcher_zygote",
                               "agent-sandbox-launcher-zygote", site=True)
        self._netns = serve_peer.own_netns()

    async def start_gateway(self) -> None:
        """egress-proxy in gateway mode; its two ports once it says ``listening``."""
        argv = [*boot.python_argv("egress-proxy", "bin.egress_proxy",
                                  die_with_sig=signal.SIGTERM),
                "--listen=127.0.0.1:0", "--socks=127.0.0.1:0", "--control=" + self.control]
        self.gateway = proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            while not (self.http_port and self.socks_port):
                line = await proc.stdout.readline()
                if not line:
                    raise LaunchError(f"egress-proxy exited while starting "
                                      f"(status {await proc.wait()})")
                url = listening_url(line.decode(errors="replace"))
                if url and url.startswith("http://"):
                    self.http_port = int(url.rsplit(":", 1)[1].rstrip("/"))
                elif url and url.startswith("socks5://"):
                    self.socks_port = int(url.rsplit(":", 1)[1].rstrip("/"))

    async def _gateway(self, frame: dict[str, Any]) -> dict[str, Any]:
        """One request on the gateway's control socket and its reply."""
        reader, writer = await asyncio.open_unix_connection(self.control, limit=MAX_REPLY)
        try:
            writer.write(json.dumps(frame, separators=(",", ":")).encode() + b"\n")
            await writer.drain()
            answer: dict[str, Any] = json.loads(await reader.readuntil(b"\n"))
            return answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def client(self, conn: Conn) -> None:
        """One session: check the peer, then its requests; its broker and tenant end with it."""
        tenant = ""
        broker = -1  # the pidfd of the session's broker, from the zygote
        try:
            refusal = serve_peer.refusal(conn.sock, self._netns)
            if refusal:
                return self._refuse(conn, refusal)
            while True:  # until the link closes: at most one broker, one session
                try:
                    line, fds = await conn.line()
                except ValueError as exc:
                    return self._refuse(conn, str(exc))
                try:
                    frame = request_frame(line)
                    if frame["op"] == "launch":
                        if broker >= 0 or tenant or len(fds) != warm_request.N_FDS:
                            raise ValueError("a launch comes alone, with four descriptors")
                        return await self._launch(conn, line, fds)
                    if frame["op"] == "broker":
                        if broker >= 0 or len(fds) != 4:
                            raise ValueError("one broker per session, on four descriptors")
                        broker = await self._broker(conn, frame, fds)
                        continue
                    if fds:
                        raise ValueError("descriptors sent with a session request")
                    if tenant:
                        raise ValueError("one session per connection")
                finally:
                    for fd in fds:
                        os.close(fd)
                added = await self._add_tenant(conn, frame)
                if added is None:  # the gateway refused it: said to the session
                    return None
                tenant = added
                conn.send(_reply(True, tenant=tenant, http_port=self.http_port,
                                 socks_port=self.socks_port))
        except ValueError as exc:
            self._refuse(conn, str(exc))
        except (OSError, Closed, LaunchError):
            pass
        finally:
            if broker >= 0:  # whatever of the session's broker is left goes with it
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(broker, signal.SIGKILL)
                os.close(broker)
            if tenant:
                self.sessions -= 1
                with contextlib.suppress(OSError, ValueError, asyncio.IncompleteReadError):
                    await self._gateway({"op": "remove", "tenant": tenant})
                _say(f"session {tenant} ended ({self.sessions} now)")
            conn.close()
        return None

    async def _broker(self, conn: Conn, frame: dict[str, Any], fds: list[int]) -> int:
        """The session's broker forked by the zygote: its pidfd (said to the session), or -1."""
        try:
            pid, broker = await self.zygote.fork(
                frame["env"], frame["cwd"], frame["umask"], frame["socket_fd"], fds)
        except (LaunchError, OSError, ValueError) as exc:
            # The session goes on: its launcher spawns a broker of its own.
            _say(f"the zygote gave no broker: {exc}")
            conn.send(_reply(False, error=f"no broker: {exc}"))
            return -1
        conn.send(_reply(True, pid=pid), [broker])
        return broker

    async def _launch(self, conn: Conn, line: bytes, fds: list[int]) -> None:
        """A warm run: the request and the connection to the launcher zygote, which answers
        the client itself from then on (its pid and pidfd, then its status)."""
        if len(line) > warm_request.MAX_REQUEST:
            return self._refuse(conn, "a launch request over the limit", "a run")
        try:
            answer = await self.launcher.ask(line, [*fds, conn.sock.fileno()])
        except (LaunchError, OSError, ValueError) as exc:
            return self._refuse(conn, f"no warm run: {exc}", "a run")
        if "pid" in answer:
            _say(f"run {answer['pid']} started warm")
        return None  # a refusal was said to the client and logged by the zygote

    async def _add_tenant(self, conn: Conn, frame: dict[str, Any]) -> str | None:
        """The session's tenant added to the gateway: its name, counted (the caller removes
        it at the end); None when the gateway refused it (the session is told why)."""
        add = {"op": "add", "tenant": frame["tenant"], "password": frame["password"],
               "policy": frame.get("policy") or {}}
        if frame.get("env") is not None:
            add["env"] = frame["env"]
        answer = await self._gateway(add)
        if answer.get("ok") is not True:
            conn.send(_reply(False, error=str(answer.get("error", "refused"))))
            return None
        tenant: str = frame["tenant"]
        self.sessions += 1
        _say(f"session {tenant} started ({self.sessions} now)")
        return tenant

    @staticmethod
    def _refuse(conn: Conn, why: str, what: str = "a session") -> None:
        _say(f"refused {what}: {why}")
        with contextlib.suppress(OSError):
            conn.send(_reply(False, error=why))

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                sock, _ = await loop.sock_accept(self.listener)
                task = asyncio.create_task(self.client(Conn(sock)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[int] = loop.create_future()

        def stopping(sig: int) -> None:
            if not stop.done():
                stop.set_result(sig)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stopping, sig)
        await asyncio.gather(self.start_gateway(), self.zygote.start(), self._start_launcher())
        assert self.gateway is not None and self.zygote.proc is not None
        self.listener.setblocking(False)
        accepting = asyncio.ensure_future(self._accept())
        _say(f"serving: gateway http 127.0.0.1:{self.http_port}, "
             f"socks 127.0.0.1:{self.socks_port}; broker zygote pid {self.zygote.proc.pid}; "
             f"launcher zygote pid {self.launcher.proc.pid if self.launcher.proc else '-'}")
        gateway_done = asyncio.ensure_future(self.gateway.wait())
        zygote_done = asyncio.ensure_future(self.zygote.proc.wait())
        done, _ = await asyncio.wait({stop, gateway_done, zygote_done},
                                     return_when=asyncio.FIRST_COMPLETED)
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        if gateway_done in done:
            _say(f"egress-proxy exited (status {gateway_done.result()}): every session ends")
            return 1
        if zygote_done in done:
            _say(f"the broker zygote exited (status {zygote_done.result()}): every session ends")
            return 1
        return 0

    async def _start_launcher(self) -> None:
        """The launcher zygote; without it, runs start cold (the service serves them anyway)."""
        try:
            await self.launcher.start()
        except (LaunchError, OSError, TimeoutError) as exc:
            _say(f"no launcher zygote ({exc}): every run starts cold")

    async def close(self) -> None:
        await self.launcher.close()
        await self.zygote.close()
        proc = self.gateway
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _reply(ok: bool, **fields: Any) -> bytes:
    return (json.dumps({"ok": ok, **fields}, separators=(",", ":")) + "\n").encode()


def main(socket_path: str) -> int:
    """Serve until SIGTERM/SIGINT (0) or until the gateway dies (1)."""
    listener = activated_socket()
    bound = ""
    if listener is None:
        if not socket_path:
            raise UsageError("no socket: XDG_RUNTIME_DIR is not set; name one with --socket")
        listener = bind_socket(socket_path)
        bound = socket_path
    base = os.path.dirname(bound or socket_path) or None
    workdir = tempfile.mkdtemp(prefix="serve-", dir=base if base and os.path.isdir(base)
                               else None)
    service = Service(listener, workdir)

    async def body() -> int:
        try:
            return await service.run()
        finally:
            await service.close()

    try:
        return asyncio.run(body())
    except LaunchError as exc:
        _say(str(exc))
        return 1
    finally:
        listener.close()
        if bound:
            with contextlib.suppress(OSError):
                os.unlink(bound)
        with contextlib.suppress(OSError):
            os.unlink(service.control)
        with contextlib.suppress(OSError):
            os.rmdir(workdir)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()

