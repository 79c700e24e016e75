"""The host side of the network bridge: unix socket in, the proxy's TCP port out.

The sandbox (bwrap) has a network namespace of its own, so it cannot reach
the proxy's loopback port.  Its forwarder connects instead to a unix socket in
the runtime directory, bind-mounted into the sandbox; here each such
connection is joined to a fresh TCP connection to the egress proxy.  The proxy
thus sees the launcher (same user) as its peer, and the allow list, address
rules and token injection apply unchanged.

The listening socket is made before the sandbox starts (its path must exist to
be reachable); accepting starts once the proxy's port is known.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

from libbroker.launcher.forwarder import pump


class Relay:
    """One unix-socket listener relaying to ``127.0.0.1:port``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(128)
        self._port = 0
        self._thread: threading.Thread | None = None

    def start(self, port: int) -> None:
        """Accept on a daemon thread, joining each connection to ``port``."""
        self._port = port
        self._thread = threading.Thread(target=self._accept_loop, name=f"relay:{port}", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed: the session is over
            try:
                up = socket.create_connection(("127.0.0.1", self._port), timeout=10)
                up.settimeout(None)
            except OSError as exc:
                sys.stderr.write(f"agent-sandbox: proxy at port {self._port} unreachable: {exc}\n")
                conn.close()
                continue
            pump(conn, up)

    def close(self) -> None:
        """Stop accepting; live connections end with the sandbox."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=1)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
