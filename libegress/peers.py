"""Who is on the other end of a loopback TCP connection.

The proxy adds the person's token, so it serves that person's processes and no
other account on the machine.  The kernel names the uid owning the peer's
socket: asked for that one socket (sock_diag), else in its socket table
(``/proc/net/tcp`` and ``tcp6``, read by :mod:`libbroker.proc_tcp`, which the
broker's door shares).  A peer whose row cannot be found is refused, like one
of another uid.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time

from libbroker.proc_tcp import PeerSocket, find_peer, peer_in_tables
from libegress.addresses import IPAddress

__all__ = ["PeerSocket", "PidFinder", "find_peer", "is_loopback", "peer_socket", "socket_owners"]


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NOCOOKIE = 0xFFFFFFFF


def diag_request(peer: tuple[IPAddress, int], ours: tuple[IPAddress, int], seq: int) -> bytes:
    """A sock_diag request for the one TCP socket peer -> ours (pure)."""
    family = socket.AF_INET if peer[0].version == 4 else socket.AF_INET6
    src = peer[0].packed.ljust(16, b"\0")
    dst = ours[0].packed.ljust(16, b"\0")
    sockid = struct.pack("!HH", peer[1], ours[1]) + src + dst + struct.pack(
        "=III", 0, _NOCOOKIE, _NOCOOKIE)
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    return struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq,
                       0) + body


def diag_reply(data: bytes) -> PeerSocket | None:
    """The uid and inode in a sock_diag answer; None for an error or no socket (pure)."""
    if len(data) < 16:
        return None
    _, kind = struct.unpack_from("=IH", data)
    if kind != _SOCK_DIAG_BY_FAMILY or len(data) < 16 + 72:
        return None
    uid, inode = struct.unpack_from("=II", data, 16 + 64)
    return PeerSocket(uid=uid, inode=inode)


def _diag(peer: tuple[IPAddress, int], ours: tuple[IPAddress, int]) -> PeerSocket | None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(diag_request(peer, ours, 1), (0, 0))
        return diag_reply(nl.recv(8192))


def peer_socket(
    peer: tuple[IPAddress, int], ours: tuple[IPAddress, int], proc: str = "/proc"
) -> PeerSocket | None:
    """The peer's socket owner from the kernel, or None if not found.

    The kernel is asked for exactly that socket (netlink sock_diag: microseconds);
    reading the whole table from /proc is the fallback, since it costs
    milliseconds once a machine holds thousands of sockets.
    """
    peer, ours = (_unmap(peer[0]), peer[1]), (_unmap(ours[0]), ours[1])
    try:
        found = _diag(peer, ours)
        if found is None and peer[0].version == 4 and ours[0].version == 4:
            # The peer may be an AF_INET6 socket connected to a mapped address.
            mapped = [(ipaddress.IPv6Address("::ffff:" + str(a)), p) for a, p in (peer, ours)]
            found = _diag(mapped[0], mapped[1])
        return found
    except OSError:
        pass
    return peer_in_tables(peer, ours, proc)


def _unmap(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def socket_owners(proc: str = "/proc") -> dict[int, int]:
    """Every socket inode open in a process under ``proc``, mapped to a pid."""
    owners: dict[int, int] = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return owners
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                owners.setdefault(int(link[8:-1]), int(pid))
    return owners


class PidFinder:
    """Peer pids for log lines, at a bounded cost.

    A scan of /proc costs tens of milliseconds on a busy machine and runs on
    the event loop, so a flood of refused connections must not trigger one
    each: one scan answers every lookup, and an unknown inode rescans only
    when the last scan is older than ``interval`` (else the pid is unknown).
    """

    def __init__(self, proc: str = "/proc", interval: float = 1.0) -> None:
        self._proc = proc
        self._interval = interval
        self._owners: dict[int, int] = {}
        self._scanned = -interval

    def pid(self, inode: int) -> int | None:
        found = self._owners.get(inode)
        if found is not None:
            return found
        now = time.monotonic()
        if now - self._scanned < self._interval:
            return None
        self._owners = socket_owners(self._proc)
        self._scanned = now
        return self._owners.get(inode)


def is_loopback(address: IPAddress) -> bool:
    """Loopback, including the IPv4-mapped form a dual-stack listener sees."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
