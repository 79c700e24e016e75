"""The one network bridge into a bwrap sandbox's own network namespace.

bwrap's ``--unshare-all`` gives a sandbox a network namespace with nothing
but loopback, so the host's egress proxy (127.0.0.1:PORT on the host) is out
of reach.  The bridge opens a listener on 127.0.0.1:PORT *inside* that
namespace, from the host (:func:`listen_in_netns`: a short-lived forked child
joins the sandbox's user and network namespaces, binds, and hands the socket
back over SCM_RIGHTS), and a :class:`Bridge` relays each connection accepted
there to a fresh connection to the host's port: the sandbox reaches exactly
that one port, and no route out exists.  The proxy sees the host side's
socket as its peer (same uid, the host's loopback), so its peer check is the
same as for any local client.

The broker (each brokered command in proxy mode) and the session (the
proxy's HTTP and SOCKS ports) use it alike.  bench/bridges.py chose it: the
host-made listener sets a connection up fastest (no process inside, no unix
socket handed a descriptor), and :func:`pump` moves the bytes spliced in the
kernel, the fastest copy measured.

Sockets come from ``_socket``, the C module: ``socket.py``'s enum
conversions cost the launcher ~5 ms of CPU while the servers start.
"""

from __future__ import annotations

import _socket
import contextlib
import errno
import os
import sys
import threading
import time

from libbroker.errors import SpawnError
from libbroker.sandbox.libc import check, libc

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable, Iterator
    from typing import Any
else:
    import _signal as signal  # the C module: signal.py's enum wrappers cost the launcher

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace (Linux 4.9)
_BIND_WAIT = 2.0  # bwrap brings the namespace's loopback up just after it starts
_CHUNK = 1 << 16  # the copying fallback's buffer
_PIPE_SIZE = 1 << 20  # /proc/sys/fs/pipe-max-size's default
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, spelled out for older Pythons
# accept() failures that pass: the listener itself is fine.
_TRANSIENT = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EINTR}
)


def listen_in_netns(pid: int, ports: tuple[int, ...]) -> list[_socket.socket]:
    """TCP listeners on 127.0.0.1:``port`` for each of ``ports``, in ``pid``'s network namespace.

    One forked child makes them all; SpawnError if it cannot.
    """
    import fcntl  # only when a sandbox is bridged; imported here, the child imports nothing
    from array import array  # SCM_RIGHTS as socket.send_fds and recv_fds pack it (C module)

    lib = libc()  # loaded here: the child imports nothing (another thread may hold the lock)
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        child = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        raise SpawnError(f"cannot fork: {exc.strerror}") from None
    if child == 0:
        _listener_child(pid, ports, theirs, array, lib, fcntl)  # never returns
    theirs.close()
    fds = array("i")
    try:
        message, ancdata, _, _ = ours.recvmsg(512, _socket.CMSG_LEN(len(ports) * fds.itemsize))
        for level, kind, data in ancdata:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    finally:
        ours.close()
        os.waitpid(child, 0)
    if len(fds) != len(ports):
        for fd in fds:
            os.close(fd)
        reason = message.decode(errors="replace") or "no answer"
        raise SpawnError(f"cannot open the proxy port inside the sandbox: {reason}")
    return [_socket.socket(fileno=fd) for fd in fds]


def _listener_child(
    pid: int, ports: tuple[int, ...], channel: Any, array: Any, lib: Any, fcntl: Any
) -> None:
    status = 0
    try:
        signal.set_wakeup_fd(-1)
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        # The user namespace that owns the netns, asked of the netns itself: the
        # sandbox's process may since sit in a nested one (bwrap makes one as
        # it drops to the sandbox's uid), whose rights do not reach its netns.
        # Joining the owner is what lets an unprivileged caller (the owner's
        # owner) join the netns.
        owner = fcntl.ioctl(net, _NS_GET_USERNS)
        if os.fstat(owner).st_ino != os.stat("/proc/self/ns/user").st_ino:
            check(lib.setns(owner, _CLONE_NEWUSER), "setns(the sandbox's user namespace)")
        check(lib.setns(net, _CLONE_NEWNET), "setns(the sandbox's network namespace)")
        deadline = time.monotonic() + _BIND_WAIT
        socks = []
        for port in ports:
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            while True:
                try:
                    sock.bind(("127.0.0.1", port))
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                        raise
                    time.sleep(0.002)
            sock.listen(128)
            socks.append(sock)
        rights = array("i", [s.fileno() for s in socks])
        channel.sendmsg([b"ok"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    except BaseException as exc:  # the child must never return into the server's code
        with contextlib.suppress(OSError):
            channel.send(str(exc).encode()[:500])
        status = 1
    finally:
        os._exit(status)


def accept_each(
    sock: _socket.socket, closing: Callable[[], bool], what: str
) -> Iterator[tuple[_socket.socket, Any]]:
    """Each connection accepted on ``sock`` (close-on-exec) and its peer, until it closes.

    Out of descriptors or memory for now refuses that connection, not all
    later ones; any other failure, or ``closing()``, ends the loop.
    """
    while True:
        try:
            # close-on-exec, as socket.accept() makes it (not in typeshed)
            fd, peer = sock._accept()  # type: ignore[attr-defined]
        except OSError as exc:
            if closing() or exc.errno not in _TRANSIENT:
                return  # closed: the session is over
            sys.stderr.write(f"agent-sandbox: {what} cannot accept: {exc.strerror}\n")
            time.sleep(0.1)
            continue
        yield _socket.socket(fileno=fd), peer


def _copy(src: _socket.socket, dst: _socket.socket) -> None:
    """Move bytes src -> dst until src's end of stream, inside the kernel if it can.

    socket -> pipe -> socket with ``os.splice``: the bytes never reach Python,
    and a 1 MiB pipe makes one system call pair per MiB, not per 64 KiB.
    Errors (a reset, a closed peer) propagate to the caller.
    """
    import fcntl

    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    try:
        try:  # noqa: SIM105 - contextlib costs start-up time here
            fcntl.fcntl(wfd, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # refused (over the per-user pipe quota): the 64 KiB default still works
        s, d = src.fileno(), dst.fileno()
        while True:
            try:
                n = os.splice(s, wfd, _PIPE_SIZE)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                break  # this pair cannot splice (the pipe is empty here): copy instead
            if n == 0:
                return
            while n:
                n -= os.splice(rfd, d, n)
    finally:
        os.close(rfd)
        os.close(wfd)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while True:
        n = src.recv_into(buf)
        if n == 0:
            return
        dst.sendall(view[:n])


class _Tunnel:
    """Two sockets and the count of directions still moving; the last one closes both."""

    def __init__(self, a: _socket.socket, b: _socket.socket, lock: threading.Lock) -> None:
        self.a, self.b = a, b
        self.left = 2
        self.lock = lock

    def ended(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.a.close()
            self.b.close()


def _shutdown(sock: _socket.socket, how: int) -> None:
    try:  # noqa: SIM105 - contextlib costs start-up time here
        sock.shutdown(how)
    except OSError:
        pass  # the peer is already gone: nothing left to tell it


def _half(src: _socket.socket, dst: _socket.socket, tunnel: _Tunnel) -> None:
    try:
        _copy(src, dst)
    except OSError:
        # A reset, a vanished peer, a failed write: the whole tunnel is over.
        # Shutting both sockets wakes the other direction from its splice.
        _shutdown(src, _socket.SHUT_RDWR)
        _shutdown(dst, _socket.SHUT_RDWR)
    else:
        # End of stream: pass the half-close on; the other direction goes on.
        _shutdown(dst, _socket.SHUT_WR)
    finally:
        tunnel.ended()


def pump(a: _socket.socket, b: _socket.socket) -> None:
    """Relay two connected sockets both ways on two threads; both close at the end.

    Each direction passes its end of stream on as a half-close (``SHUT_WR``);
    an error in either ends both.  The sockets must be blocking.  OSError
    when a thread cannot start (both sockets are closed then too).
    """
    tunnel = _Tunnel(a, b, threading.Lock())
    directions = ((a, b, "up"), (b, a, "down"))
    for i, (src, dst, name) in enumerate(directions):
        thread = threading.Thread(target=_half, args=(src, dst, tunnel), name=f"pump-{name}")
        thread.daemon = True
        try:
            thread.start()
        except RuntimeError as exc:  # out of threads: this connection cannot be served
            _shutdown(a, _socket.SHUT_RDWR)  # ends a direction that did start
            _shutdown(b, _socket.SHUT_RDWR)
            for _ in directions[i:]:
                tunnel.ended()
            raise OSError(errno.EAGAIN, f"cannot start a relay thread: {exc}") from None


class Bridge:
    """Relays each connection accepted on ``listener`` to the host's ``127.0.0.1:port``.

    One thread accepts; each connection gets a fresh connection to the port
    and :func:`pump`'s two threads.  :meth:`close` stops accepting and ends
    every connection still relayed (the sandbox is gone or going).
    """

    def __init__(self, listener: _socket.socket, port: int, what: str = "proxy bridge") -> None:
        self._listener = listener
        self._port = port
        self._what = what
        self._closing = False
        self._live: list[_socket.socket] = []
        self._lock = threading.Lock()
        listener.setblocking(True)
        self._thread = threading.Thread(target=self._accept_loop, name=what, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        for conn, _ in accept_each(self._listener, lambda: self._closing, self._what):
            up = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            try:
                up.settimeout(10)
                up.connect(("127.0.0.1", self._port))
                up.settimeout(None)
                conn.settimeout(None)
                # A relay passes on segments as they come: Nagle would only delay them.
                for sock in (conn, up):
                    sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            except OSError as exc:
                sys.stderr.write(f"agent-sandbox: {self._what}: port {self._port} unreachable: "
                                 f"{exc.strerror or exc}\n")  # fmt: skip
                conn.close()
                up.close()
                continue
            with self._lock:
                if self._closing:
                    conn.close()
                    up.close()
                    return
                self._live = [s for s in self._live if s.fileno() != -1] + [conn, up]
            try:
                pump(conn, up)
            except OSError as exc:  # no thread for it: both are closed
                sys.stderr.write(f"agent-sandbox: {self._what}: {exc.strerror}\n")

    def close(self) -> None:
        """Stop accepting, end every relayed connection; idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            live, self._live = self._live, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(_socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        for sock in live:  # wakes both directions from their splice; the pump closes them
            with contextlib.suppress(OSError):
                sock.shutdown(_socket.SHUT_RDWR)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1)
