"""The proxy port inside a bwrap sandbox's own network namespace.

bwrap's ``--unshare-all`` gives the command a network namespace with nothing
but a loopback device, so the host's proxy (127.0.0.1:PORT on the host) is
out of reach.  For profile network mode ``proxy`` the server opens a listener
on 127.0.0.1:PORT *inside* that namespace and relays each connection to the
host's 127.0.0.1:PORT: the command can reach exactly that one port, nothing
else, and no route out exists.

The listener is made by a short-lived forked child that joins the sandbox's
user and network namespaces (the server itself never changes namespace),
binds, and hands the socket back over SCM_RIGHTS.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import time

from libbroker.errors import SpawnError
from libbroker.sandbox.libc import check, libc

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_BIND_WAIT = 2.0  # bwrap brings the namespace's loopback up just after it starts


def listen_in_netns(pid: int, port: int) -> socket.socket:
    """A TCP listener on 127.0.0.1:``port`` in the network namespace of ``pid``."""
    ours, theirs = socket.socketpair()
    try:
        child = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        raise SpawnError(f"cannot fork: {exc.strerror}") from None
    if child == 0:
        _listener_child(pid, port, theirs)  # never returns
    theirs.close()
    try:
        message, fds, _, _ = socket.recv_fds(ours, 512, 1)
    finally:
        ours.close()
        os.waitpid(child, 0)
    if not fds:
        reason = message.decode(errors="replace") or "no answer"
        raise SpawnError(f"cannot open the proxy port inside the sandbox: {reason}")
    listener = socket.socket(fileno=fds[0])
    listener.setblocking(False)
    return listener


def _listener_child(pid: int, port: int, channel: socket.socket) -> None:
    status = 0
    try:
        signal.set_wakeup_fd(-1)
        user = f"/proc/{pid}/ns/user"
        if os.stat(user).st_ino != os.stat("/proc/self/ns/user").st_ino:
            # Joining the sandbox's user namespace first is what lets an
            # unprivileged server (the namespace's owner) join its netns.
            _setns(user, _CLONE_NEWUSER)
        _setns(f"/proc/{pid}/ns/net", _CLONE_NEWNET)
        sock = socket.socket()
        deadline = time.monotonic() + _BIND_WAIT
        while True:
            try:
                sock.bind(("127.0.0.1", port))
                break
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                    raise
                time.sleep(0.002)
        sock.listen(64)
        socket.send_fds(channel, [b"ok"], [sock.fileno()])
    except BaseException as exc:  # the child must never return into the server's code
        with contextlib.suppress(OSError):
            channel.send(str(exc).encode()[:500])
        status = 1
    finally:
        os._exit(status)


def _setns(path: str, kind: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc().setns(fd, kind), f"setns({path})")
    finally:
        os.close(fd)


class ProxyRelay:
    """Accepts inside the sandbox, connects to the host's proxy port, copies both ways.

    Owned by the command's Child: :meth:`close` ends every relayed connection.
    """

    def __init__(self, listener: socket.socket, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.listener = listener
        self.port = port
        self.tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._serve())

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = self.loop.create_task(coro)  # type: ignore[arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self) -> None:
        while True:
            try:
                inner, _ = await self.loop.sock_accept(self.listener)
            except OSError:
                return
            self._spawn(self._relay(inner))

    async def _relay(self, inner: socket.socket) -> None:
        outer = socket.socket()
        outer.setblocking(False)
        inner.setblocking(False)
        try:
            await self.loop.sock_connect(outer, ("127.0.0.1", self.port))
            await asyncio.gather(self._copy(inner, outer), self._copy(outer, inner))
        except OSError:
            pass
        finally:
            inner.close()
            outer.close()

    async def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := await self.loop.sock_recv(src, 1 << 16):
                await self.loop.sock_sendall(dst, data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        # The pending accept still watches the fd: unwatch before closing it.
        self.loop.remove_reader(self.listener.fileno())
        self.listener.close()
