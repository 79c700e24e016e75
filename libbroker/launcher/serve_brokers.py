"""The service's side of the broker zygote (:mod:`.broker_zygote`): start it, ask for forks.

The zygote is a child of the service on a ``SOCK_SEQPACKET`` pair (one message
per request, descriptors attached).  Requests are serialized: a fork takes
milliseconds.  If the zygote dies, the service ends (as when its gateway dies):
every link closes and every session ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Callable

from libbroker.errors import LaunchError
from libbroker.launcher import boot

MAX_REPLY = 4096
START_TIMEOUT = 20.0


class Zygote:
    """One zygote child of the service: the broker's (default) or the launcher's."""

    def __init__(self, module: str = "libbroker.launcher.broker_zygote",
                 name: str = "agent-sandbox-broker-zygote", *, site: bool = False) -> None:
        self.module = module
        self.name = name
        # With site: the interpreter's prefix is the installation's (a launcher
        # forked from it finds its servers' site-packages as the client would).
        self.site = site
        self.proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if self.site:
            argv = [sys.executable, "-P", "-c", boot.die_with(signal.SIGKILL)
                    + f"import sys; sys.argv[0] = {self.name!r}\n"
                    + f"from {self.module} import main; sys.exit(main())"]
        else:
            argv = boot.python_argv(self.name, self.module, die_with_sig=signal.SIGKILL)
        argv += [str(theirs.fileno()), str(os.getpid())]
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        async with asyncio.timeout(START_TIMEOUT):
            ready = await asyncio.get_running_loop().sock_recv(ours, MAX_REPLY)
        if not ready:
            raise LaunchError(f"the {self.name} exited while starting "
                              f"(status {await self.proc.wait()})")

    async def fork(self, env: dict[str, str], cwd: str, umask: int, socket_fd: int,
                   fds: list[int]) -> tuple[int, int]:
        """A new broker on ``fds`` (stdin, stdout, stderr, its socket): its (pid, pidfd)."""
        request = json.dumps({"env": env, "cwd": cwd, "umask": umask,
                              "socket_fd": socket_fd}).encode()
        data, got = await self._exchange(request, fds, 1)
        answer = json.loads(data)
        if not got or not isinstance(answer.get("pid"), int):
            for fd in got:
                os.close(fd)
            raise LaunchError(f"the broker zygote could not fork: {answer.get('error')}")
        return int(answer["pid"]), got[0]

    async def ask(self, request: bytes, fds: list[int]) -> dict[str, object]:
        """One request with ``fds`` and the zygote's answer (no descriptors: the launcher's)."""
        if self.proc is None or self.proc.returncode is not None:
            raise LaunchError(f"the {self.name} is gone")
        data, _ = await self._exchange(request, fds, 0)
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise LaunchError(f"the {self.name} answered no object")
        return answer

    async def _exchange(self, request: bytes, fds: list[int],
                        nfds: int) -> tuple[bytes, list[int]]:
        """Send ``request`` with ``fds``; the answer and up to ``nfds`` descriptors with it.
        One exchange at a time (the lock): answers come in the order asked."""
        sock = self._sock
        if sock is None:
            raise LaunchError(f"the {self.name} is gone")
        loop = asyncio.get_running_loop()
        async with self._lock:
            sock.setblocking(True)
            try:
                socket.send_fds(sock, [request], fds)
            finally:
                sock.setblocking(False)
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _waker(ready))
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            if nfds:
                data, got, _, _ = socket.recv_fds(sock, MAX_REPLY, nfds)
            else:
                data, got = sock.recv(MAX_REPLY), []
        if not data:
            for fd in got:
                os.close(fd)
            raise LaunchError(f"the {self.name} is gone")
        return data, got

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _waker(ready: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    return wake
