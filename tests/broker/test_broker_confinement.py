"""What a brokered command cannot do, with each backend, and hostile clients."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import uuid

import pytest

from libbroker.wire import (
    Channel,
    FrameDecoder,
    Request,
    decode_error,
    decode_exit,
    encode_frame,
    encode_request,
)


def test_home_file_is_unreadable(broker) -> None:
    home = os.path.expanduser("~")
    secret = os.path.join(home, f".broker-test-{uuid.uuid4().hex}")
    with open(secret, "w") as fh:
        fh.write("home-secret-content\n")
    try:
        done = broker.sh(f"broker-client -- cat {secret}")
        assert done.returncode != 0
        assert b"home-secret-content" not in done.stdout
    finally:
        os.unlink(secret)


def test_cannot_write_outside_the_workdir(broker) -> None:
    name = f"broker-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", f"/var/tmp/{name}", os.path.expanduser(f"~/{name}")]
    script = "; ".join(f"echo x > {t}" for t in targets) + "; echo ok > inside"
    broker.sh(f"broker-client -- sh -c '{script}'")
    for target in targets:
        assert not os.path.exists(target), target
    with open(os.path.join(broker.workdir, "inside")) as fh:
        assert fh.read() == "ok\n"


def test_private_tmp_is_writable(broker) -> None:
    done = broker.sh("broker-client -- sh -c 'f=${TMPDIR:-/tmp}/x; echo hi > $f && cat $f'")
    assert done.stdout == b"hi\n", done.stderr


def test_tcp_to_a_loopback_server_fails(broker) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "except OSError as e:\n"
        "    print('refused', e); sys.exit(1)\n"
        "print('connected')\n"
    )
    done = broker.sh(f"broker-client -- {sys.executable} -I -S -c \"{code}\"")
    assert done.returncode == 1 and b"refused" in done.stdout, (done.stdout, done.stderr)
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()


def test_environment_is_only_the_allowed_names(broker, tools) -> None:
    done = broker.sh("broker-client -- env")
    names = {line.split(b"=", 1)[0].decode() for line in done.stdout.splitlines()}
    allowed = {"PATH", "LANG", "LC_ALL", "TERM", "HOME", "USER", "TZ", "TMPDIR"}
    assert names <= allowed, names - allowed
    assert tools.secret.encode() not in done.stdout
    # Nor through the server's /proc entry.
    peek = broker.sh(f"broker-client -- cat /proc/{broker.proc.pid}/environ")
    assert tools.secret.encode() not in peek.stdout


def exchange(broker, data: bytes) -> list[tuple[Channel, bytes]]:
    """Send raw bytes, read frames until the server closes."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(broker.socket)
        with contextlib.suppress(OSError):  # refused before reading: the frame is still there
            sock.sendall(data)
        decoder = FrameDecoder()
        got: list[tuple[Channel, bytes]] = []
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return got
            got += decoder.feed(data)


def test_env_field_is_refused(broker) -> None:
    body = {"argv": ["env"], "cwd": broker.workdir, "with_stdin": False, "env": {"A": "1"}}
    request = encode_frame(Channel.REQUEST, json.dumps(body).encode())
    [(channel, payload)] = exchange(broker, request)
    assert channel is Channel.ERROR and "'env' is refused" in decode_error(payload)


def test_garbage_and_a_4_gib_length_get_error_frames(broker) -> None:
    [(channel, payload)] = exchange(broker, b"\xff" * 64)
    assert channel is Channel.ERROR and "unknown channel" in decode_error(payload)
    [(channel, payload)] = exchange(broker, struct.pack(">BI", 5, 0xFFFFFFFF))
    assert channel is Channel.ERROR and "exceeds" in decode_error(payload)
    [(channel, payload)] = exchange(broker, encode_frame(Channel.STDIN, b"x"))
    assert channel is Channel.ERROR and "first frame must be a request" in decode_error(payload)
    # The server is still serving.
    req = Request(("true",), broker.workdir, with_stdin=False)
    [(channel, payload)] = exchange(broker, encode_request(req))
    assert channel is Channel.EXIT and decode_exit(payload) == 0


def test_ping_and_unknown_sign_key(broker) -> None:
    [(channel, payload)] = exchange(broker, encode_request(Request((), "/", op="ping")))
    assert (channel, decode_exit(payload)) == (Channel.EXIT, 0)
    sign = Request((), "/", with_stdin=True, op="sign", key="NOT-ENABLED")
    [(channel, payload)] = exchange(broker, encode_request(sign))
    assert channel is Channel.ERROR and "not enabled" in decode_error(payload)


def test_another_uid_is_refused(broker) -> None:
    base = os.path.dirname(broker.socket)
    os.chmod(base, 0o711)  # let the other uid reach and connect at all: SO_PEERCRED decides
    os.chmod(broker.socket, 0o666)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            frames = exchange(broker, encode_request(Request(("true",), broker.workdir)))
            os.write(w, json.dumps([(int(c), decode_error(p)) for c, p in frames]).encode())
        except BaseException as exc:
            os.write(w, json.dumps(repr(exc)).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, 4096):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    os.chmod(broker.socket, 0o600)
    os.chmod(base, 0o700)
    result = json.loads(got)
    assert isinstance(result, list), result
    [(channel, message)] = result
    assert channel == Channel.ERROR and "uid 65534" in message


def test_socket_is_private(broker) -> None:
    assert os.stat(broker.socket).st_mode & 0o777 == 0o600


def test_odd_signal_numbers_and_silent_clients_do_no_harm(broker) -> None:
    req = Request(("sh", "-c", "sleep 0.2; echo done"), broker.workdir, with_stdin=False)
    frames = exchange(broker, encode_request(req) + bytes([6, 0, 0, 0, 1, 200]))
    assert frames[-1][0] is Channel.EXIT and decode_exit(frames[-1][1]) == 0
    assert (Channel.STDOUT, b"done\n") in frames
    with socket.socket(socket.AF_UNIX) as sock:  # connects, says nothing, leaves
        sock.connect(broker.socket)
    [(channel, _payload)] = exchange(broker, encode_request(Request((), "/", op="ping")))
    assert channel is Channel.EXIT


def test_udp_to_a_loopback_listener_never_arrives(broker) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"    s.sendto(b'leak', ('127.0.0.1', {port}))\n"
        "except OSError as e:\n"
        "    print('refused', e)\n"
    )
    broker.sh(f"broker-client -- {sys.executable} -I -S -c \"{code}\"")
    with pytest.raises(TimeoutError):
        listener.recvfrom(100)
    listener.close()


def test_a_host_unix_socket_cannot_be_reached(broker) -> None:
    home = os.path.expanduser("~")
    path = os.path.join(home, f".broker-test-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    server.settimeout(0.5)
    code = (
        "import socket\n"
        "a, b = socket.socketpair(); a.send(b'ok'); print(b.recv(2).decode())\n"
        "try:\n"
        f"    socket.socket(socket.AF_UNIX).connect({path!r}); print('connected')\n"
        "except OSError as e:\n"
        "    print('refused')\n"
    )
    try:
        done = broker.sh(f"broker-client -- {sys.executable} -I -S -c \"{code}\"")
        assert done.stdout.split() == [b"ok", b"refused"], done.stderr
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
        os.unlink(path)
