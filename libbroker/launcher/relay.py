"""The host side of the network bridge: unix socket in, a proxy connection out.

The sandbox (bwrap) has a network namespace of its own, so it cannot reach
the proxy's loopback port.  Its forwarder connects instead to a unix socket in
the runtime directory, bind-mounted into the sandbox; here each such
connection is answered with a fresh TCP connection to the egress proxy,
passed over as a descriptor (SCM_RIGHTS), after which both ends close.  The
proxy thus sees the launcher (same user, host loopback) as its peer, and the
allow list, address rules and token injection apply unchanged; the bytes then
flow between the sandbox's forwarder and the proxy without a host hop (see
:func:`libbroker.sandbox.forwarder.dial_proxy`).

Why not let the proxy listen on this unix socket itself: the proxy serves one
person's token and decides who its peer is from the kernel's TCP table (the
uid owning the peer's socket, and its pid for the log).  A unix listener would
need a second, SO_PEERCRED-based check in the proxy, and behind the bind
mount every peer is the sandbox, whose pids mean nothing on the host.  Handing
over a socket the launcher connected keeps the proxy's one TCP door and its
peer check exactly as they are, at the cost of one connect per connection.

The listening socket and its accepting thread are made before the sandbox
starts (its path must exist to be reachable); relaying starts once the
proxy's port is known.

Sockets come from ``_socket``, the C module: ``socket.py``'s enum
conversions cost the launcher ~5 ms of CPU while the servers start.
"""

from __future__ import annotations

import _socket
import contextlib
import errno
import os
import sys
import threading
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

# accept() failures that pass: the listener itself is fine.
_TRANSIENT = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EINTR}
)


def accept_each(
    sock: _socket.socket, closing: Callable[[], bool], what: str
) -> Iterator[tuple[_socket.socket, Any]]:
    """Each connection accepted on ``sock`` (close-on-exec) and its peer, until it closes.

    Out of descriptors or memory for now refuses that connection, not all
    later ones; any other failure, or ``closing()``, ends the loop.
    """
    while True:
        try:
            # close-on-exec, as socket.accept() makes it (not in typeshed)
            fd, peer = sock._accept()  # type: ignore[attr-defined]
        except OSError as exc:
            if closing() or exc.errno not in _TRANSIENT:
                return  # closed: the session is over
            sys.stderr.write(f"agent-sandbox: {what} cannot accept: {exc.strerror}\n")
            time.sleep(0.1)
            continue
        yield _socket.socket(fileno=fd), peer


class Relay:
    """One unix-socket listener relaying to ``127.0.0.1:port``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._sock.bind(path)
            os.chmod(path, 0o600)
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._port = 0
        self._ready = threading.Event()  # set once the port is known, or on close
        self._closing = False
        # The accepting thread starts now, while the servers start, not after
        # they listen (where starting it would delay the go); it holds any
        # connection until :meth:`start` (none comes before the command runs).
        name = f"relay:{os.path.basename(path)}"
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._sock.close()
            raise

    def start(self, port: int) -> None:
        """Join each connection, from now on, to ``port``."""
        self._port = port
        self._ready.set()

    def _accept_loop(self) -> None:
        for conn, _ in accept_each(self._sock, lambda: self._closing, "proxy bridge"):
            try:
                self._ready.wait()
                if self._closing:
                    return
                self._hand_over(conn)
            finally:
                conn.close()

    def _hand_over(self, conn: _socket.socket) -> None:
        """Connect to the proxy and pass the connection to the forwarder at ``conn``."""
        up = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            try:
                up.settimeout(10)
                up.connect(("127.0.0.1", self._port))
                up.settimeout(None)
                # A relay passes on segments as they come: Nagle would only delay them.
                up.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            except OSError as exc:
                sys.stderr.write(f"agent-sandbox: proxy at port {self._port} unreachable: {exc}\n")
                return
            # Hand the proxy connection over; the forwarder moves the bytes itself.
            rights = up.fileno().to_bytes(4, sys.byteorder)  # one C int: SCM_RIGHTS
            with contextlib.suppress(OSError):  # the forwarder gave up: its loss
                conn.sendmsg([b"\0"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        finally:
            up.close()

    def stop(self) -> None:
        """Stop accepting, without waiting for the thread (:meth:`close` does)."""
        if self._closing:
            return
        self._closing = True
        self._ready.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(_socket.SHUT_RDWR)
        self._sock.close()

    def close(self) -> None:
        """Stop accepting and wait for the thread; live connections end with the sandbox."""
        self.stop()
        self._thread.join(timeout=1)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
