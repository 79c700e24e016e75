"""The peer check reads the kernel's socket table."""

from __future__ import annotations

import ipaddress
import os
import socket

from libegress.peers import (
    PidFinder,
    diag_reply,
    diag_request,
    find_peer,
    is_loopback,
    peer_socket,
)

TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  \
timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 222 1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 333 1
"""


def test_find_peer_picks_the_peers_row() -> None:
    lo = ipaddress.ip_address("127.0.0.1")
    found = find_peer(TABLE, (lo, 0xD431), (lo, 0x1F90), six=False)
    assert found is not None and (found.uid, found.inode) == (1000, 222)
    assert find_peer(TABLE, (lo, 1), (lo, 0x1F90), six=False) is None


def test_real_loopback_connection_is_ours() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        with client, conn:
            peer = conn.getpeername()
            ours = conn.getsockname()
            found = peer_socket((ipaddress.ip_address(peer[0]), peer[1]),
                                (ipaddress.ip_address(ours[0]), ours[1]))
            assert found is not None
            assert found.uid == os.getuid()
            assert found.inode == os.fstat(client.fileno()).st_ino


def test_real_ipv6_loopback_connection_is_ours() -> None:
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as server:
        client = socket.create_connection(server.getsockname()[:2])
        conn, _ = server.accept()
        with client, conn:
            peer, ours = conn.getpeername(), conn.getsockname()
            found = peer_socket((ipaddress.ip_address(peer[0]), peer[1]),
                                (ipaddress.ip_address(ours[0]), ours[1]))
            assert found is not None and found.uid == os.getuid()


def test_is_loopback() -> None:
    assert is_loopback(ipaddress.ip_address("127.0.0.5"))
    assert is_loopback(ipaddress.ip_address("::1"))
    assert is_loopback(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not is_loopback(ipaddress.ip_address("192.168.0.1"))


def test_pid_finder_names_the_holder_and_bounds_rescans() -> None:
    finder = PidFinder(interval=60.0)
    with socket.socket() as first:
        assert finder.pid(os.fstat(first.fileno()).st_ino) == os.getpid()
        with socket.socket() as later:
            # Within the interval an unknown inode does not cost another scan.
            assert finder.pid(os.fstat(later.fileno()).st_ino) is None
    assert PidFinder(interval=0.0).pid(1) is None


def test_diag_request_and_reply_shapes() -> None:
    lo = ipaddress.ip_address("127.0.0.1")
    req = diag_request((lo, 0xD431), (lo, 0x1F90), 7)
    assert len(req) == 72
    assert req[16:18] == bytes([socket.AF_INET, socket.IPPROTO_TCP])
    assert req[24:28] == b"\xd4\x31\x1f\x90"
    reply = bytearray(16 + 72)
    reply[4:6] = (20).to_bytes(2, "little")
    reply[16 + 64 : 16 + 72] = (1000).to_bytes(4, "little") + (222).to_bytes(4, "little")
    found = diag_reply(bytes(reply))
    assert found is not None and (found.uid, found.inode) == (1000, 222)
    assert diag_reply(b"\x00" * 36) is None
