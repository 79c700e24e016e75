"""Who owns the far end of a loopback TCP connection, from the kernel's table.

The one reading of ``/proc/net/tcp`` and ``tcp6``, shared by the broker's
door into a Landlock session (:mod:`libbroker.launcher.door`) and the egress
proxy's peer check (:mod:`libegress.peers`, which asks sock_diag first and
falls back to this).  For a loopback peer the row whose local address is the
peer's and whose remote address is ours names the uid owning the peer's
socket, and its inode.  No row (the peer is gone, or the address is not in
that table) is None: callers refuse it, as they refuse another uid.

Addresses print as 32-bit words in host byte order, the port big-endian:
127.0.0.1:8080 is ``0100007F:1F90`` on a little-endian machine.  Base layer:
standard library only, no sockets.
"""

from __future__ import annotations

import ipaddress
import sys

from libbroker.named_tuple import NamedTuple

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class PeerSocket(NamedTuple):
    """The owner (uid) and socket inode of a connection's far end (0: not in the row)."""

    uid: int
    inode: int


def _hex_address(address: Address) -> str:
    packed = address.packed
    words = [packed[i : i + 4] for i in range(0, len(packed), 4)]
    return "".join(
        int.from_bytes(w, sys.byteorder).to_bytes(4, "big").hex().upper() for w in words
    )


def endpoint(address: Address | str, port: int, six: bool = False) -> str:
    """``address:port`` as the table prints it (``six``: the tcp6 table, v4 as mapped)."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address)
    if six and address.version == 4:
        address = ipaddress.IPv6Address("::ffff:" + str(address))
    return f"{_hex_address(address)}:{port:04X}"


def find_row(table: str, local: str, remote: str) -> PeerSocket | None:
    """The row of the socket bound at ``local`` connected to ``remote`` (both :func:`endpoint`)."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[1] != local or fields[2] != remote:
            continue
        if not fields[7].isdigit():
            return None
        inode = int(fields[9]) if len(fields) > 9 and fields[9].isdigit() else 0
        return PeerSocket(uid=int(fields[7]), inode=inode)
    return None


def find_peer(
    table: str, peer: tuple[Address, int], ours: tuple[Address, int], six: bool
) -> PeerSocket | None:
    """The peer's row in one table's text (``six``: the text is tcp6's)."""
    return find_row(table, endpoint(*peer, six), endpoint(*ours, six))


def peer_in_tables(
    peer: tuple[Address, int], ours: tuple[Address, int], proc: str = "/proc"
) -> PeerSocket | None:
    """The peer's row, read from ``proc``/net/tcp (IPv4 pairs) then tcp6; None if in neither."""
    for name, six in (("tcp", False), ("tcp6", True)):
        if not six and (peer[0].version == 6 or ours[0].version == 6):
            continue
        try:
            with open(f"{proc}/net/{name}", encoding="ascii") as fh:
                found = find_peer(fh.read(), peer, ours, six)
        except (OSError, ValueError):
            continue
        if found is not None:
            return found
    return None
