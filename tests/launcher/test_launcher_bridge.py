"""The network bridge's byte relay: the forwarder's pump and the host relay.

Real sockets throughout: TCP on loopback, unix sockets in a temp dir, and the
real forwarder.py under ``python -I -S`` as the sandbox runs it (here in the
host's network namespace, on an ephemeral port).  Checks: large transfers
arrive intact (sha256) both ways at once, half-close passes through, many
connections at once, and a client that vanishes mid-transfer leaves no
thread and no descriptor behind.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from libbroker.launcher.relay import Relay
from libbroker.sandbox.forwarder import dial_proxy, pump

FORWARDER = Path(__file__).resolve().parents[2] / "libbroker" / "sandbox" / "forwarder.py"
Handler = Callable[[socket.socket], None]


@contextmanager
def _server(handle: Handler) -> Iterator[int]:
    """A loopback TCP server running ``handle`` per connection on a thread; its port."""
    lsock = socket.create_server(("127.0.0.1", 0), backlog=256)
    threads: list[threading.Thread] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=_serve_one, args=(handle, conn), daemon=True)
            threads.append(t)
            t.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield lsock.getsockname()[1]
    finally:
        lsock.shutdown(socket.SHUT_RDWR)
        lsock.close()
        acceptor.join(timeout=10)
        for t in threads:
            t.join(timeout=10)


def _serve_one(handle: Handler, conn: socket.socket) -> None:
    # The client going away (an OSError here) is what some tests do on purpose.
    with conn, suppress(OSError):
        handle(conn)


def _read_all(sock: socket.socket) -> bytes:
    got = bytearray()
    while chunk := sock.recv(1 << 20):
        got += chunk
    return bytes(got)


def _sha_reply(conn: socket.socket) -> None:
    """Read to end of stream, then answer with its sha256 and a payload of our own."""
    digest = hashlib.sha256(_read_all(conn)).digest()
    seed = digest[:8]
    conn.sendall(digest + _payload(seed, 8 << 20))
    conn.shutdown(socket.SHUT_WR)


def _payload(seed: bytes, size: int) -> bytes:
    """Deterministic bytes (so both ends can check them) that do not compress to a pattern."""
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    return b"".join(struct.pack(">Q", i) + block[8:] for i in range(size // len(block)))


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def _pump_threads() -> int:
    return sum(t.name.startswith("pump-") for t in threading.enumerate())


def _fds() -> int:
    """Open descriptors (the count includes listdir's own, before and after alike)."""
    return len(os.listdir("/proc/self/fd"))


def _settle(check: Callable[[], bool]) -> bool:
    """Poll ``check`` for up to 20 s (a bound, not a timing assertion)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@contextmanager
def _relay(tmp_path: Path, port: int, name: str = "r.sock") -> Iterator[str]:
    relay = Relay(str(tmp_path / name))
    relay.start(port)
    try:
        yield relay.path
    finally:
        relay.close()


def test_a_large_transfer_arrives_intact_both_ways_at_once_through_both_hops(
    tmp_path: Path,
) -> None:
    """client -> pump -> the socket Relay handed over -> server: 32 MiB up, 8 MiB down at once."""
    with _server(_sha_reply) as port, _relay(tmp_path, port) as path:
        inner_a, client = socket.socketpair()
        pump(inner_a, dial_proxy(path))
        up = _payload(b"up", 32 << 20)
        sender = threading.Thread(target=_send_and_close, args=(client, up))
        sender.start()
        back = _read_all(client)
        sender.join()
        client.close()
    assert back[:32] == hashlib.sha256(up).digest()
    assert hashlib.sha256(back[32:]).digest() == hashlib.sha256(
        _payload(back[:8], 8 << 20)
    ).digest()


def test_half_close_passes_through_and_the_other_direction_goes_on(tmp_path: Path) -> None:
    seen: list[bytes] = []

    def late_reply(conn: socket.socket) -> None:
        seen.append(_read_all(conn))  # our end of stream arrived: the client's SHUT_WR
        conn.sendall(b"after your EOF " * 1000)
        conn.shutdown(socket.SHUT_WR)

    with _server(late_reply) as port, _relay(tmp_path, port) as path:
        inner, client = socket.socketpair()
        pump(inner, dial_proxy(path))
        client.sendall(b"question")
        client.shutdown(socket.SHUT_WR)
        assert _read_all(client) == b"after your EOF " * 1000
        client.close()
    assert seen == [b"question"]
    assert _settle(lambda: _pump_threads() == 0)


def test_many_connections_at_once_each_get_their_own_bytes(tmp_path: Path) -> None:
    with _server(_sha_reply) as port, _relay(tmp_path, port) as path:
        results: dict[int, bool] = {}

        def one(i: int) -> None:
            inner, s = socket.socketpair()
            pump(inner, dial_proxy(path))
            data = _payload(str(i).encode(), 256 << 10)
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            back = _read_all(s)
            s.close()
            results[i] = back[:32] == hashlib.sha256(data).digest() and back[32:] == _payload(
                back[:8], 8 << 20
            )

        clients = [threading.Thread(target=one, args=(i,)) for i in range(48)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(timeout=120)
    assert results == {i: True for i in range(48)}
    assert _settle(lambda: _pump_threads() == 0)


def _endless(conn: socket.socket) -> None:
    block = os.urandom(1 << 16)
    while True:
        conn.sendall(block)


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_a_client_vanishing_mid_download_leaves_no_thread_or_fd(
    tmp_path: Path, reset: bool
) -> None:
    with _server(_endless) as port, _relay(tmp_path, port) as path:
        before = _fds()
        for _ in range(4):
            inner, client = socket.socketpair() if not reset else _tcp_pair()
            pump(inner, dial_proxy(path))
            got = 0
            while got < 4 << 20:
                got += len(client.recv(1 << 20))
            if reset:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        assert _settle(lambda: _pump_threads() == 0)
        assert _settle(lambda: _fds() <= before), (_fds(), before)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    lsock = socket.create_server(("127.0.0.1", 0))
    with lsock:
        client = socket.create_connection(lsock.getsockname())
        inner, _ = lsock.accept()
    return inner, client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def _forwarder(sock_path: str) -> Iterator[tuple[int, int]]:
    """The real forwarder.py, as bwrap runs it: its port and pid."""
    port = _free_port()
    control_r, control_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(FORWARDER), "--listen", f"{port}={sock_path}",
         "--control", str(control_r), "--", "sleep", "120"],
        pass_fds=[control_r],
        stderr=subprocess.PIPE,
    )
    os.close(control_r)
    try:
        os.write(control_w, b"g")
        assert _settle(lambda: _connectable(port)), "the forwarder never listened"
        yield port, proc.pid
    finally:
        os.close(control_w)  # end of file: the forwarder kills its command and exits
        assert proc.wait(timeout=30) == 128 + 9
        assert proc.stderr is not None
        proc.stderr.close()


def _connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _proc_counts(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def test_the_real_forwarder_relays_intact_and_cleans_up_after_vanished_clients(
    tmp_path: Path,
) -> None:
    with _server(_sha_reply) as port, _relay(tmp_path, port) as path, _forwarder(path) as (
        fport,
        pid,
    ):
        data = _payload(b"fw", 16 << 20)
        with socket.create_connection(("127.0.0.1", fport)) as s:
            sender = threading.Thread(target=_send_and_close, args=(s, data))
            sender.start()
            back = _read_all(s)
            sender.join()
        assert back[:32] == hashlib.sha256(data).digest()
        assert back[32:] == _payload(back[:8], 8 << 20)
        # Every connection so far (the fixture's probe too: accepted in order) is
        # over once only the main thread is left: its sockets closed before that.
        assert _settle(lambda: _proc_counts(pid)[1] == 1)
        baseline = _proc_counts(pid)
        # Clients that vanish mid-download, with a reset.
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", fport))
            s.sendall(b"x")
            s.shutdown(socket.SHUT_WR)
            s.recv(1 << 16)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert _settle(lambda: _proc_counts(pid) == baseline), (_proc_counts(pid), baseline)


@pytest.mark.parametrize("fail_at", [0, 1], ids=["first", "second"])
def test_no_thread_for_a_connection_closes_it_and_says_so(
    monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    real_start = threading.Thread.start
    calls = [0]

    def start(self: threading.Thread) -> None:
        calls[0] += 1
        if calls[0] > fail_at:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(OSError, match="cannot start a relay thread"):
        pump(a, b)
    monkeypatch.undo()
    assert _settle(lambda: a.fileno() == -1 and b.fileno() == -1)
    assert _settle(lambda: _pump_threads() == 0)
    assert a_peer.recv(1) == b"" and b_peer.recv(1) == b""
    a_peer.close()
    b_peer.close()


def test_the_relay_hands_over_nothing_when_the_proxy_is_down(tmp_path: Path) -> None:
    with _relay(tmp_path, _free_port()) as path:
        with pytest.raises(OSError, match="could not reach the proxy"):
            dial_proxy(path)
        # ... and keeps serving: the next one fails the same way, not with a hang.
        with pytest.raises(OSError, match="could not reach the proxy"):
            dial_proxy(path)


def test_the_relay_hands_over_a_connection_whose_peer_is_the_launcher(tmp_path: Path) -> None:
    """The proxy's peer check sees this process's own socket: same uid, host loopback."""
    peers: list[tuple[str, int]] = []

    def note(conn: socket.socket) -> None:
        peers.append(conn.getpeername())

    with _server(note) as port, _relay(tmp_path, port) as path:
        up = dial_proxy(path)
        assert up.family == socket.AF_INET and up.getpeername() == ("127.0.0.1", port)
        assert up.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        local = up.getsockname()
        up.close()
    assert peers == [local]
