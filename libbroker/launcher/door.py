"""The broker's door into a Landlock session: a loopback TCP port relayed to its socket.

A Landlock sandbox may create no unix socket (Landlock does not mediate
``connect()`` to a path-named one, so the user's agent and docker sockets
would be reachable by name; :mod:`libbroker.sandbox.seccomp` refuses them
all).  broker-client and gpg-shim still need the broker.  So the launcher
listens on ``127.0.0.1:PORT``, named to the session by
``AGENT_SANDBOX_BROKER_DOOR=PORT``; Landlock lets the sandbox connect to that
one port (as to the proxy's two); and each connection is relayed, spliced in
the kernel, to a fresh connection the launcher makes to the broker's socket.

Why a port and not an inherited descriptor: an agent's tool runner may close
every descriptor but stdio when it starts a shell (Claude Code does), which
would leave broker-client without a way in.  A variable survives that.

The port is on the host's loopback, so any local user could connect: each
connection is checked against the kernel's TCP table (``/proc/net/tcp``, read
by :mod:`libbroker.proc_tcp`, as the egress proxy's peer check does) and
served only if the peer's socket belongs to our own uid, as broker-server
does with SO_PEERCRED.  The broker sees the launcher (same uid) as its peer.
Everything from the sandbox is hostile: the door leads to one place only,
the session's broker, and carries bytes it does not read.
"""

from __future__ import annotations

import _socket
import contextlib
import os
import sys

from libbroker.quick_thread import QuickThread
from libbroker.sandbox.bridge import accept_each, pump

# proc_tcp (and ipaddress with it, ~2 ms of CPU) is loaded by the first connection's
# check, in the door's thread: the door is opened before go, and is used by few sessions.


def tcp_owner(local: tuple[str, int], remote: tuple[str, int], table: str) -> int | None:
    """The uid owning the IPv4 socket bound at ``local`` and connected to ``remote``.

    ``table`` is ``/proc/net/tcp``'s text (:mod:`libbroker.proc_tcp` reads it).
    """
    from libbroker import proc_tcp

    row = proc_tcp.find_row(table, proc_tcp.endpoint(*local), proc_tcp.endpoint(*remote))
    return row.uid if row is not None else None


class Door:
    """The launcher's door: a loopback listener, one thread accepting, two per relay."""

    def __init__(self, broker_path: str) -> None:
        self.broker_path = broker_path
        self._sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            self._sock.bind(("127.0.0.1", 0))
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        self._closing = False
        self._thread = QuickThread(self._accept_loop, name="broker-door")  # (its start: no wait)
        self._thread.start()

    def _accept_loop(self) -> None:
        for conn, peer in accept_each(self._sock, lambda: self._closing, "broker door"):
            if self._closing:
                conn.close()
                return
            self._serve(conn, peer)

    def _serve(self, conn: _socket.socket, peer: tuple[str, int]) -> None:
        """Check the peer, connect to the broker, relay; ``conn`` is ours to close."""
        import ipaddress

        from libbroker import proc_tcp

        ours = (ipaddress.IPv4Address("127.0.0.1"), self.port)
        found = proc_tcp.peer_in_tables((ipaddress.IPv4Address(peer[0]), peer[1]), ours)
        owner = found.uid if found is not None else None
        if owner != os.getuid():
            sys.stderr.write(
                f"agent-sandbox: broker door: refused a connection from port {peer[1]} "
                f"(uid {owner if owner is not None else 'unknown'}, not ours)\n"
            )
            conn.close()
            return
        broker = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            broker.settimeout(10)
            broker.connect(self.broker_path)
            broker.settimeout(None)
            conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            pump(conn, broker)  # both close when the relay ends
        except OSError as exc:
            sys.stderr.write(f"agent-sandbox: broker door: cannot reach the broker: {exc}\n")
            conn.close()
            broker.close()

    def close(self) -> None:
        """Stop accepting; relays in flight end with their connections (the sandbox's end)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(_socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=1)
