"""Who is at the other end of the service's socket: its uid and network namespace, race-free.

A peer may register a session only when it is of the service's uid and in the
service's network namespace (a bwrap sandbox has one of its own).  The uid is
the kernel's record of the connect (``SO_PEERCRED``).  The namespace belongs to
a process, and a pid is no name for one: the peer may have exited since it
connected (a child of its holding the connection), and its pid may have gone
to another process since, one in the service's namespace.  ``/proc/PID/ns/net``
would then describe that other process.  So the process is taken by a pidfd:

- ``SO_PEERPIDFD`` (Linux 6.5) is a pidfd of the process that connected, made
  by the kernel from the socket itself: no pid is looked up at all;
- its namespace is read through the pidfd (``PIDFD_GET_NET_NAMESPACE``, Linux
  6.11), or, before that, from ``/proc/PID/ns/net`` followed by a signal 0
  through the pidfd: a process still alive after the open was the one the pid
  named during it;
- a peer that has exited (a stale pidfd) is refused.

Without ``SO_PEERPIDFD`` (before Linux 6.5) the pidfd comes from
``pidfd_open`` of the ``SO_PEERCRED`` pid: the window between the connect and
the service's accept then remains (the check is made at accept); said in
docs/serve.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket

from libbroker.launcher.serve_link import peer_ids

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5; Python 3.11 has no name
PIDFD_GET_NET_NAMESPACE = 0xFF04  # _IO(PIDFS_IOCTL_MAGIC 0xFF, 4), Linux 6.11
_NO_IOCTL = (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP)


def own_netns() -> tuple[int, int]:
    """This process's network namespace (nsfs device and inode: its identity)."""
    st = os.stat("/proc/self/ns/net")
    return st.st_dev, st.st_ino


def peer_pidfd(sock: socket.socket, pid: int) -> tuple[int, bool]:
    """A pidfd of the process that connected ``sock``; True when the kernel made it from
    the socket (``SO_PEERPIDFD``), False when from ``pid`` (``pidfd_open``)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4)
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:  # (an unknown option): the peer is gone, or worse
            raise
    else:
        return int.from_bytes(raw, "little", signed=True), True
    if pid <= 0:  # the peer is in a pid namespace we cannot see
        raise OSError(errno.ESRCH, "the peer's pid is not visible here")
    return os.pidfd_open(pid), False


def _netns_by_proc(pidfd: int, pid: int) -> tuple[int, int]:
    """The namespace from /proc/PID, proven to be the pidfd's process's by a signal 0 after."""
    if pid <= 0:
        raise OSError(errno.ESRCH, "the peer's pid is not visible here")
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OSError(errno.ESRCH, "exited") from None
    try:
        st = os.fstat(fd)
        # Alive now, so alive during the open: the pid named it, no other process.
        signal.pidfd_send_signal(pidfd, 0)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def netns_of(pidfd: int, pid: int) -> tuple[int, int]:
    """The network namespace of the pidfd's process; OSError (ESRCH) once it has exited."""
    try:
        fd = fcntl.ioctl(pidfd, PIDFD_GET_NET_NAMESPACE)
    except OSError as exc:
        if exc.errno not in _NO_IOCTL:
            raise
        return _netns_by_proc(pidfd, pid)
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def refusal(sock: socket.socket, netns: tuple[int, int]) -> str:
    """Why the peer of ``sock`` may not register a session ("" when it may)."""
    try:
        pid, uid = peer_ids(sock)
    except OSError as exc:
        return f"its credentials cannot be read ({exc.strerror})"
    if uid != os.getuid():
        return f"peer uid {uid} is not the service's uid {os.getuid()}"
    try:
        pidfd, _ = peer_pidfd(sock, pid)
    except OSError as exc:  # ESRCH, EINVAL (6.5 to 6.15): reaped before the accept
        return f"peer pid {pid} has exited since it connected ({exc.strerror})"
    try:
        theirs = netns_of(pidfd, pid)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return f"peer pid {pid} has exited since it connected"
        return f"peer pid {pid}'s network namespace cannot be read ({exc.strerror})"
    finally:
        with contextlib.suppress(OSError):
            os.close(pidfd)
    if theirs != netns:
        return f"peer pid {pid} is in another network namespace (a sandbox)"
    return ""
