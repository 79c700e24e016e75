"""Handed-over listening sockets (docs/fast-start.md): egress-proxy --listen-fd/--socks-fd,
broker-server --socket-fd.

A client connects before the server process exists; the server, started
afterwards on the handed socket, answers it.  Every descriptor that is not a
listening socket of the right kind is refused with one line and exit 2.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
from pathlib import Path

import pytest


def _listening_tcp() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def _start(argv: list[str], fds: list[int]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _first_line(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().decode()


@pytest.mark.parametrize("size", [0, 1, 5000, 70_000])
def test_egress_proxy_answers_a_connection_made_before_it_started(size: int) -> None:
    http, socks = _listening_tcp(), _listening_tcp()
    early = socket.create_connection(http.getsockname())  # no proxy process yet
    pad = f"X-Pad: {'x' * size}\r\n" if size else ""
    head = f"CONNECT early.invalid:443 HTTP/1.1\r\nHost: early.invalid:443\r\n{pad}\r\n"
    early.setblocking(False)
    sent = early.send(head.encode())  # what the backlog's buffer takes before the proxy runs
    proc = _start(["egress-proxy", f"--listen-fd={http.fileno()}",
                   f"--socks-fd={socks.fileno()}", "--allow=allowed.invalid"],
                  [http.fileno(), socks.fileno()])
    port, socks_port = http.getsockname()[1], socks.getsockname()[1]
    http.close()
    socks.close()
    try:
        assert _first_line(proc) == f"listening http://127.0.0.1:{port}\n"
        assert _first_line(proc) == f"listening socks5://127.0.0.1:{socks_port}\n"
        early.setblocking(True)
        early.sendall(head.encode()[sent:])
        early.settimeout(30)
        answer = early.recv(4096)
        # Answered by the proxy (not reset, not refused by the kernel): a 403
        # for a host off the list, a 431 for a head too long.
        assert answer.startswith((b"HTTP/1.1 403", b"HTTP/1.1 431")), answer
    finally:
        early.close()
        proc.terminate()
        assert proc.wait(30) == 0


def _broker_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "b.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock, path


@pytest.mark.parametrize("size", [0, 100, 200_000])
def test_broker_server_answers_a_client_that_came_before_it(tmp_path: Path, size: int) -> None:
    sock, path = _broker_socket(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(size))
    with payload.open("rb") as stdin:
        client = subprocess.Popen(
            ["broker-client", f"--socket={path}", "-C", str(work), "--", "sh", "-c", "wc -c"],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    # The client's connection waits in the backlog (the socket reads as ready
    # to accept), no broker process yet, and the client is not refused.
    ready, _, _ = select.select([sock], [], [], 60)
    assert ready == [sock]
    assert client.poll() is None
    server = _start(["broker-server", f"--socket-fd={sock.fileno()}", f"--workdir={work}"],
                    [sock.fileno()])
    sock.close()
    try:
        assert _first_line(server) == f"listening unix:{path}\n"
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        assert out.decode().strip() == str(size)
    finally:
        server.terminate()
        assert server.wait(30) == 0
    assert os.path.exists(path)  # the handed socket is its owner's to remove


def _refusal(argv: list[str], fds: list[int]) -> str:
    done = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def _bad_descriptors(tmp_path: Path) -> dict[str, int]:
    """Descriptors that are no listening socket of either kind, by what they are."""
    plain = os.open(tmp_path, os.O_RDONLY)
    unbound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    not_listening = socket.socket()
    not_listening.bind(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    found = {"directory": plain, "unbound unix": unbound.detach(),
             "tcp not listening": not_listening.detach(), "udp": udp.detach()}
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    found["closed"] = closed
    return found


@pytest.mark.parametrize("flag", ["--listen-fd", "--socks-fd"])
def test_egress_proxy_refuses_what_is_not_a_listening_tcp_socket(
    tmp_path: Path, flag: str
) -> None:
    unix, _ = _broker_socket(tmp_path)
    bad = {**_bad_descriptors(tmp_path), "listening unix": unix.fileno()}
    base = [] if flag == "--listen-fd" else ["--listen=127.0.0.1:0"]
    for what, fd in bad.items():
        fds = [] if what == "closed" else [fd]
        err = _refusal(["egress-proxy", *base, f"{flag}={fd}"], fds)
        assert flag in err, (what, err)
    for word in ("0", "2", "-1", "x", "99999999"):
        err = _refusal(["egress-proxy", *base, f"{flag}={word}"], [])
        assert flag in err, (word, err)


def test_broker_server_refuses_what_is_not_a_listening_unix_socket(tmp_path: Path) -> None:
    tcp = _listening_tcp()
    bad = {**_bad_descriptors(tmp_path), "listening tcp": tcp.fileno()}
    for what, fd in bad.items():
        fds = [] if what == "closed" else [fd]
        err = _refusal(["broker-server", f"--socket-fd={fd}", f"--workdir={tmp_path}"], fds)
        assert "--socket-fd" in err, (what, err)
    for word in ("0", "2", "-1", "x", "99999999"):
        err = _refusal(["broker-server", f"--socket-fd={word}", f"--workdir={tmp_path}"], [])
        assert "--socket-fd" in err, (word, err)
