"""The broker's door into a Landlock session (libbroker.launcher.door, libbroker.broker.dial).

A real Door in front of a real unix listener standing in for the broker; the
client side is :func:`libbroker.broker.dial.dial`, as broker-client and gpg-shim use it.
Everything that arrives through the door is hostile.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from libbroker.broker.dial import DOOR_ENV_VAR, SOCKET_ENV_VAR, dial
from libbroker.errors import BrokerUnavailable
from libbroker.launcher.door import Door


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    """A stand-in broker: answers each connection with ``hello`` and what it read."""
    path = str(tmp_path / "broker.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # a client that left: the next one
                conn.sendall(b"hello " + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    yield path
    listener.close()


@pytest.fixture
def door(broker: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Door]:
    d = Door(broker)
    monkeypatch.setenv(SOCKET_ENV_VAR, broker)
    monkeypatch.setenv(DOOR_ENV_VAR, str(d.inner_fd))
    yield d
    d.close()


def _talk(sock: socket.socket | object) -> bytes:
    s = socket.socket(fileno=sock.detach())  # type: ignore[attr-defined]
    with s:
        s.sendall(b"x")
        return s.recv(100)


def test_a_client_gets_a_connected_broker_socket(door: Door, broker: str) -> None:
    for _ in range(20):  # one door, many clients in turn
        assert _talk(dial(broker)) == b"hello x"


def test_concurrent_clients(door: Door, broker: str) -> None:
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(_talk(dial(broker)))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [b"hello x"] * 16


def test_another_socket_path_does_not_use_the_door(door: Door, tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailable, match="does not exist"):
        dial(str(tmp_path / "elsewhere.sock"))


def test_hostile_messages_leave_the_door_working(door: Door, broker: str) -> None:
    gate = socket.socket(fileno=os.dup(door.inner_fd))
    r, w = os.pipe()
    a, b = socket.socketpair()
    try:
        gate.send(b"no descriptor at all")
        # a pipe, not a socket: nothing to answer on
        gate.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        # many descriptors: the first is answered, the rest closed
        many = array.array("i", [b.fileno(), w, r, b.fileno()])
        gate.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, many)])
        a.settimeout(10)
        msg, anc, _, _ = a.recvmsg(10, socket.CMSG_SPACE(4))
        assert msg == b"\1" and anc
        os.close(int.from_bytes(anc[0][2][:4], sys.byteorder))
        # a reply socket nobody reads, full to the brim: the door must not block on it
        c, unread = socket.socketpair()
        c.setblocking(False)
        try:
            while True:
                c.send(b"y" * 65536)
        except BlockingIOError:
            pass
        full = array.array("i", [c.fileno()])
        gate.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, full)])
        assert _talk(dial(broker)) == b"hello x"
        c.close()
        unread.close()
    finally:
        for s in (gate, a, b):
            s.close()
        os.close(r)
        os.close(w)


def test_no_broker_behind_the_door_is_a_clear_refusal(door: Door, broker: str) -> None:
    os.unlink(broker)
    with pytest.raises(BrokerUnavailable, match="door refused: cannot reach the broker"):
        dial(broker)


def test_a_closed_door_says_what_closed_it(broker: str, tmp_path: Path) -> None:
    d = Door(broker)
    fd = d.inner_fd
    d.close()  # the descriptor is gone, as when Python's subprocess closed it
    env = dict(os.environ, **{SOCKET_ENV_VAR: broker, DOOR_ENV_VAR: str(fd)})
    done = subprocess.run(
        ["broker-client", "--", "true"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 125
    assert "door" in done.stderr and "pass_fds" in done.stderr and "Traceback" not in done.stderr
