"""The servers' one unix listening socket: 0600, a stale one replaced, a live one refused.

broker-server (tests/broker/test_broker_server_lifecycle.py) and egress-proxy's
``--control`` both bind through :func:`libbroker.unix_listen.listen_unix`;
here its rules, with real sockets, and the control socket's refusal as its
flag's one line.
"""

from __future__ import annotations

import os
import socket
import stat

import pytest

from libbroker.errors import SocketInUse, UsageError
from libbroker.unix_listen import listen_unix
from libegress.control import open_control


def test_a_fresh_socket_is_0600_and_listening(tmp_path) -> None:
    path = str(tmp_path / "s.sock")
    with listen_unix(path, 8) as sock:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
        assert sock.getblocking() is False


def test_a_stale_socket_is_replaced(tmp_path) -> None:
    path = str(tmp_path / "s.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the path stays, nobody listens: what a killed server leaves
    with listen_unix(path, 8), socket.socket(socket.AF_UNIX) as client:
        client.connect(path)


def test_a_live_socket_is_refused_and_kept(tmp_path) -> None:
    path = str(tmp_path / "s.sock")
    with listen_unix(path, 8):
        with pytest.raises(SocketInUse, match="already listening"):
            listen_unix(path, 8)
        with pytest.raises(UsageError, match=r"^--control: a server is already listening"):
            open_control(path)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)  # still the first server's


@pytest.mark.parametrize("kind", ["file", "dir", "link"])
def test_what_is_not_a_socket_is_left_alone(tmp_path, kind) -> None:
    path = tmp_path / "s.sock"
    if kind == "file":
        path.write_text("keep me")
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SocketInUse, match="is not a socket; not replacing it"):
        listen_unix(str(path), 8)
    assert os.path.lexists(path)
    if kind == "file":
        assert path.read_text() == "keep me"
