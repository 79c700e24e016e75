"""Who is on the other end of a loopback TCP connection.

The proxy adds the person's token, so it serves that person's processes and no
other account on the machine.  For a loopback peer the kernel's socket table
(``/proc/net/tcp`` and ``tcp6``) names the uid owning the peer's socket: the
row whose local address is the peer's and whose remote address is ours.  A
peer whose row cannot be found is refused, like one of another uid.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass

from libegress.addresses import IPAddress


@dataclass(frozen=True)
class PeerSocket:
    """The owner (uid) and socket inode of a connection's far end."""

    uid: int
    inode: int


def _hex_address(address: IPAddress) -> str:
    """``address`` as /proc/net/tcp prints it: 32-bit words in host byte order."""
    packed = address.packed
    words = [packed[i : i + 4] for i in range(0, len(packed), 4)]
    return "".join(
        int.from_bytes(w, "little" if sys.byteorder == "little" else "big")
        .to_bytes(4, "big")
        .hex()
        .upper()
        for w in words
    )


def _endpoint(address: IPAddress, port: int, six: bool) -> str:
    if six and address.version == 4:
        address = ipaddress.IPv6Address("::ffff:" + str(address))
    return f"{_hex_address(address)}:{port:04X}"


def find_peer(
    table: str, peer: tuple[IPAddress, int], ours: tuple[IPAddress, int], six: bool
) -> PeerSocket | None:
    """The peer's row in one socket table's text (pure)."""
    want_local = _endpoint(peer[0], peer[1], six)
    want_remote = _endpoint(ours[0], ours[1], six)
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[1] != want_local or fields[2] != want_remote:
            continue
        return PeerSocket(uid=int(fields[7]), inode=int(fields[9]))
    return None


def peer_socket(
    peer: tuple[IPAddress, int], ours: tuple[IPAddress, int], proc: str = "/proc"
) -> PeerSocket | None:
    """The peer's socket owner from the kernel's tables, or None if not found."""
    peer, ours = (_unmap(peer[0]), peer[1]), (_unmap(ours[0]), ours[1])
    for name, six in (("tcp", False), ("tcp6", True)):
        if not six and (peer[0].version == 6 or ours[0].version == 6):
            continue
        try:
            with open(f"{proc}/net/{name}", encoding="ascii") as fh:
                found = find_peer(fh.read(), peer, ours, six)
        except OSError:
            continue
        if found is not None:
            return found
    return None


def _unmap(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def pid_of_inode(inode: int, proc: str = "/proc") -> int | None:
    """A process holding socket ``inode`` open, for log lines only."""
    target = f"socket:[{inode}]"
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return int(pid)
            except OSError:
                continue
    return None


def is_loopback(address: IPAddress) -> bool:
    """Loopback, including the IPv4-mapped form a dual-stack listener sees."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
