"""The broker's door into a Landlock session: a connected socket handed in on request.

A Landlock sandbox may create no unix socket (Landlock does not mediate
``connect()`` to a path-named one, so the user's agent and docker sockets
would be reachable by name; :mod:`libbroker.sandbox.seccomp` refuses them
all).  broker-client and gpg-shim still need the broker.  The session
therefore inherits one end of a ``SOCK_SEQPACKET`` socketpair, the *door*,
named by ``AGENT_SANDBOX_BROKER_DOOR``; the launcher holds the other end.

A client makes a socketpair of its own (allowed: it reaches nothing), sends
one end through the door, and waits on the other.  For each message the
launcher connects a fresh unix socket to the broker, on the host, and sends
that connected socket back over the client's end (SCM_RIGHTS).  The client
then talks to the broker directly, at full speed, exactly as it would have
through the path; the broker sees the launcher (same uid) as the peer.

Everything from the sandbox is hostile: a message with no descriptor is
ignored, extra descriptors are closed, the answer is sent without blocking
(a client that does not read cannot stall the door), and the door leads to
one place only, the session's broker.  The bwrap session needs no door: its
network namespace and mounts already leave nothing else to reach.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import os
import sys
import threading

_FD_BYTES = array.array("i").itemsize


class Door:
    """The launcher's end of the door, answered by one thread until :meth:`close`."""

    def __init__(self, broker_path: str) -> None:
        self.broker_path = broker_path
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self._sock = ours
        self.inner_fd = theirs.detach()  # the sandbox's end: the caller passes it on
        os.set_inheritable(self.inner_fd, True)
        self._thread = threading.Thread(target=self._serve, name="broker-door", daemon=True)
        self._thread.start()

    def close_inner(self) -> None:
        """Close our copy of the sandbox's end, once the sandbox holds it."""
        if self.inner_fd >= 0:
            os.close(self.inner_fd)
            self.inner_fd = -1

    def _serve(self) -> None:
        space = _socket.CMSG_SPACE(16 * _FD_BYTES)
        while True:
            try:
                # close-on-exec at once: the launcher spawns children meanwhile
                data, ancillary, _, _ = self._sock.recvmsg(16, space, _socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return  # closed: the session is over
            if not data and not ancillary:
                return  # every copy of the sandbox's end is gone
            fds = _received_fds(ancillary)
            try:
                if fds:
                    self._answer(fds[0])
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _answer(self, reply_fd: int) -> None:
        """Connect to the broker and pass the connection back on ``reply_fd``."""
        try:
            reply = _socket.socket(fileno=os.dup(reply_fd))
        except OSError:
            return  # not a socket: nothing to answer on
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            try:
                conn.settimeout(10)
                conn.connect(self.broker_path)
                conn.settimeout(None)
            except OSError as exc:
                message = f"cannot reach the broker: {exc.strerror or exc}".encode()
                with contextlib.suppress(OSError):
                    reply.sendmsg([b"\0" + message[:200]], [], _socket.MSG_DONTWAIT)
                sys.stderr.write(f"agent-sandbox: broker door: {message.decode()}\n")
                return
            rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _fd_bytes(conn.fileno()))]
            with contextlib.suppress(OSError):  # the client gave up: its loss
                reply.sendmsg([b"\1"], rights, _socket.MSG_DONTWAIT)
        finally:
            conn.close()
            reply.close()

    def close(self) -> None:
        """Stop answering; the thread ends at once."""
        self.close_inner()
        with contextlib.suppress(OSError):
            self._sock.shutdown(_socket.SHUT_RDWR)
        self._thread.join(timeout=1)
        self._sock.close()


def _fd_bytes(fd: int) -> bytes:
    return array.array("i", [fd]).tobytes()


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _FD_BYTES
            fds += array.array("i", payload[:usable]).tolist()
    return fds
