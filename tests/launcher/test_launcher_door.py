"""The broker's door into a Landlock session (libbroker.launcher.door, libbroker.broker.dial).

A real Door in front of a real unix listener standing in for the broker; the
client side is :func:`libbroker.broker.dial.dial`, as broker-client and gpg-shim
use it.  Everything that arrives through the door is hostile.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from libbroker.broker.dial import DOOR_ENV_VAR, SOCKET_ENV_VAR, dial
from libbroker.errors import BrokerUnavailable
from libbroker.launcher.door import Door, tcp_owner


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    """A stand-in broker: reads to end of stream, answers with the sha256 of what came."""
    path = str(tmp_path / "broker.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)

    def one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a client that left: the next one
            digest = hashlib.sha256()
            while data := conn.recv(1 << 16):
                digest.update(data)
            conn.sendall(b"hello " + digest.hexdigest().encode())

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield path
    listener.close()


@pytest.fixture
def door(broker: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Door]:
    d = Door(broker)
    monkeypatch.setenv(SOCKET_ENV_VAR, broker)
    monkeypatch.setenv(DOOR_ENV_VAR, str(d.port))
    yield d
    d.close()


def _talk(sock: socket.socket | object, payload: bytes = b"x") -> bytes:
    s = socket.socket(fileno=sock.detach())  # type: ignore[attr-defined]
    with s:
        answer = b""
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the half-close crosses the relay
            while data := s.recv(1 << 16):
                answer += data
        except (ConnectionResetError, BrokenPipeError):  # closed with our bytes unread
            return b"<reset>"
        except OSError as exc:  # the reset came before our shutdown: a refusal too
            if exc.errno != errno.ENOTCONN:
                raise
            return b"<reset>"
        return answer


def _hello(payload: bytes) -> bytes:
    return b"hello " + hashlib.sha256(payload).hexdigest().encode()


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 8 << 20])
def test_a_client_reaches_the_broker_intact(door: Door, broker: str, size: int) -> None:
    payload = os.urandom(size)
    assert _talk(dial(broker), payload) == _hello(payload)


def test_concurrent_clients(door: Door, broker: str) -> None:
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(_talk(dial(broker)))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [_hello(b"x")] * 16


def test_another_socket_path_does_not_use_the_door(door: Door, tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailable, match="does not exist"):
        dial(str(tmp_path / "elsewhere.sock"))


def test_garbage_and_hang_ups_leave_the_door_working(door: Door, broker: str) -> None:
    for payload in (b"", b"\xff" * 100, b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", door.port)) as s:
            s.sendall(payload)
    assert _talk(dial(broker)) == _hello(b"x")


def test_no_broker_behind_the_door_closes_the_connection(door: Door, broker: str) -> None:
    os.unlink(broker)
    # closed, never relayed: the client then reports a lost broker, exit 125
    assert _talk(dial(broker)) in (b"", b"<reset>")


def test_a_closed_door_is_a_clear_125(broker: str) -> None:
    d = Door(broker)
    port = d.port
    d.close()
    env = dict(os.environ, **{SOCKET_ENV_VAR: broker, DOOR_ENV_VAR: str(port)})
    done = subprocess.run(
        ["broker-client", "--", "true"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 125
    assert "door" in done.stderr and "Traceback" not in done.stderr


def test_the_peer_check_reads_the_kernels_tcp_table() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000\n"
        "   1: 0100007F:9C41 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0\n"
    )
    assert tcp_owner(("127.0.0.1", 0x9C40), ("127.0.0.1", 0x1F90), table) == 1000
    assert tcp_owner(("127.0.0.1", 0x9C41), ("127.0.0.1", 0x1F90), table) == 0
    assert tcp_owner(("127.0.0.1", 0x9C42), ("127.0.0.1", 0x1F90), table) is None


def test_another_user_is_refused(door: Door, broker: str) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to act as another user")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs a system python3 another user can run")
    script = (
        "import socket,sys\n"
        f"s=socket.create_connection(('127.0.0.1',{door.port}))\n"
        "try:\n"
        "    s.sendall(b'x'); s.shutdown(socket.SHUT_WR)\n"
        "    sys.stdout.write(repr(s.recv(100)))\n"
        "except OSError:\n"  # the door's reset may come before the shutdown (ENOTCONN)
        "    sys.stdout.write('reset')\n"
    )
    done = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
         "/usr/bin/python3", "-I", "-S", "-c", script],
        capture_output=True, text=True, timeout=30, cwd="/",
    )  # fmt: skip
    assert done.stdout in ("b''", "reset"), done.stderr  # closed, never relayed
    assert _talk(dial(broker)) == _hello(b"x")  # and the door still serves us
