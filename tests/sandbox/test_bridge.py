"""The one network bridge (libbroker/sandbox/bridge.py): its pump, its Bridge, its listener.

Real sockets throughout: TCP on loopback, a Bridge on a listener in this
namespace and one that :func:`listen_in_netns` opened inside a real bwrap
sandbox.  Checks: large transfers arrive intact (sha256) both ways at once,
half-close passes through, many connections at once, a client that vanishes
mid-transfer leaves no thread and no descriptor behind, a port that is down
closes the connection and says so, and the far end's peer is this process.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
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

from libbroker import proc_tcp
from libbroker.sandbox import bwrap
from libbroker.sandbox.bridge import Bridge, listen_in_netns, pump

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


def _up(port: int) -> socket.socket:
    """A connection to the server, as the Bridge makes for each one it accepts."""
    return socket.create_connection(("127.0.0.1", port))


def test_a_large_transfer_arrives_intact_both_ways_at_once_through_the_pump(
    tmp_path: Path,
) -> None:
    """client -> pump -> server: 32 MiB up, 8 MiB down at once."""
    with _server(_sha_reply) as port:
        inner_a, client = socket.socketpair()
        pump(inner_a, _up(port))
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

    with _server(late_reply) as port:
        inner, client = socket.socketpair()
        pump(inner, _up(port))
        client.sendall(b"question")
        client.shutdown(socket.SHUT_WR)
        assert _read_all(client) == b"after your EOF " * 1000
        client.close()
    assert seen == [b"question"]
    assert _settle(lambda: _pump_threads() == 0)


def test_many_connections_at_once_each_get_their_own_bytes(tmp_path: Path) -> None:
    with _server(_sha_reply) as port:
        results: dict[int, bool] = {}

        def one(i: int) -> None:
            inner, s = socket.socketpair()
            pump(inner, _up(port))
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
    with _server(_endless) as port:
        before = _fds()
        for _ in range(4):
            inner, client = socket.socketpair() if not reset else _tcp_pair()
            pump(inner, _up(port))
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
def _bridge(port: int) -> Iterator[Bridge]:
    """A Bridge on a loopback listener of its own, to ``port``; its listener's port in .port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    bridge = Bridge(listener, port)  # type: ignore[arg-type]
    bridge.port = listener.getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield bridge
    finally:
        bridge.close()


def _bridge_threads() -> int:
    return sum(t.name.startswith(("pump-", "proxy bridge")) for t in threading.enumerate())


def _connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_the_bridge_relays_intact_and_cleans_up_after_vanished_clients() -> None:
    with _server(_sha_reply) as port, _bridge(port) as bridge:
        bport = bridge.port  # type: ignore[attr-defined]
        before = _fds()
        data = _payload(b"fw", 16 << 20)
        with socket.create_connection(("127.0.0.1", bport)) as s:
            sender = threading.Thread(target=_send_and_close, args=(s, data))
            sender.start()
            back = _read_all(s)
            sender.join()
        assert back[:32] == hashlib.sha256(data).digest()
        assert back[32:] == _payload(back[:8], 8 << 20)
        # Clients that vanish mid-download, with a reset.
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", bport))
            s.sendall(b"x")
            s.shutdown(socket.SHUT_WR)
            s.recv(1 << 16)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert _settle(lambda: _pump_threads() == 0)
        assert _settle(lambda: _fds() <= before), (_fds(), before)
    assert _settle(lambda: _bridge_threads() == 0)


def test_closing_the_bridge_ends_the_connections_it_relays() -> None:
    with _server(_endless) as port, _bridge(port) as bridge:
        client = socket.create_connection(("127.0.0.1", bridge.port))  # type: ignore[attr-defined]
        assert client.recv(1 << 16)
        bridge.close()
        client.settimeout(20)
        with suppress(OSError):
            while client.recv(1 << 20):
                pass
        client.close()
    assert _settle(lambda: _bridge_threads() == 0)


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


def test_a_port_that_is_down_closes_the_connection_says_so_and_serves_on(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with _bridge(_free_port()) as bridge:
        for _ in range(2):  # ... and keeps serving: the next one ends the same way, no hang
            with socket.create_connection(("127.0.0.1", bridge.port)) as s:  # type: ignore[attr-defined]
                s.settimeout(20)
                assert s.recv(1) == b""
    assert capfd.readouterr().err.count("unreachable") == 2


def test_the_far_end_sees_this_process_as_its_peer() -> None:
    """The proxy's peer check sees the bridge's own socket: this uid, this process, loopback."""
    found: list[object] = []

    def note(conn: socket.socket) -> None:
        peer, ours = conn.getpeername(), conn.getsockname()
        row = proc_tcp.peer_in_tables(
            (ipaddress.ip_address(peer[0]), peer[1]), (ipaddress.ip_address(ours[0]), ours[1])
        )
        mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")}  # fmt: skip
        found.append(row is not None and row.uid == os.getuid() and f"socket:[{row.inode}]" in mine)
        conn.sendall(b"ok")

    with _server(note) as port, _bridge(port) as bridge:
        s = socket.create_connection(("127.0.0.1", bridge.port))  # type: ignore[attr-defined]
        with s:
            assert s.recv(2) == b"ok"
    assert found == [True]


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bwrap is not installed")
def test_listeners_opened_inside_a_bwrap_sandbox_reach_the_host_port() -> None:
    """listen_in_netns in a real sandbox's own netns: the client inside reaches the host's port."""
    with _server(_sha_reply) as port:
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        client = (
            "import hashlib, socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "s.sendall(b'inside' * 100000); s.shutdown(socket.SHUT_WR)\n"
            "got = b''\n"
            "while chunk := s.recv(1 << 20): got += chunk\n"
            "print(got[:32] == hashlib.sha256(b'inside' * 100000).digest(), len(got))\n"
        )
        proc = subprocess.Popen(
            ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--info-fd", str(info_w), "--block-fd", str(block_r), "--",
             sys.executable, "-I", "-S", "-c", client],
            pass_fds=(info_w, block_r), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        os.close(info_w)
        os.close(block_r)
        inner = bwrap.read_info(info_r)
        os.close(info_r)
        assert inner is not None
        [listener] = listen_in_netns(inner, (port,))
        bridge = Bridge(listener, port)
        os.write(block_w, b"go")
        os.close(block_w)
        out, _ = proc.communicate(timeout=60)
        bridge.close()
    assert out.split() == ["True", str(32 + (8 << 20))]
    assert _settle(lambda: _bridge_threads() == 0)
