"""The in-sandbox side of the network bridge, and the parent of the agent's command.

bwrap runs this file with ``python3 -I -S`` (standard library only, no site,
no environment) as the first process of the sandbox, inside its own network
namespace, where the only interface is loopback.  It:

1. listens on ``127.0.0.1:PORT`` for each ``--listen PORT=SOCKET`` and relays
   every connection to the egress proxy over a TCP socket that the launcher's
   end of the unix ``SOCKET`` (bind-mounted from the session's runtime
   directory) connects on the host and hands over (:func:`dial_proxy`).
   So ``HTTPS_PROXY=http://127.0.0.1:3128`` and
   ``ALL_PROXY=socks5h://127.0.0.1:1080`` work inside, and nothing else does;
2. waits for the launcher's go byte on ``--control FD`` (the launcher sends it
   once the proxy and broker listen: the sandbox is built while they start);
3. starts the command (posix_spawn), then relays signals: every later byte on the
   control pipe is a signal number for the command (its process group when it
   has one); end of file means the launcher is gone, so the command is killed;
4. exits with the command's status (128+N when signal N ended it).

:func:`pump` moves the bytes (spliced, in the kernel), one thread per direction.
"""

from __future__ import annotations

import _socket
import errno
import os
import select
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import signal
    import threading
else:
    import _signal as signal  # the C module: signal.py's enum wrappers cost more than this file

# Start-up is part of every session (this runs before the command): the C
# modules _socket, _signal and select stand in for socket, signal and
# selectors (whose enum conversions cost more than the rest of this file),
# and threading and fcntl load with the first connection (no contextlib: it
# alone costs ~6 ms here).

_CHUNK = 1 << 16  # the copying fallback's buffer
_PIPE_SIZE = 1 << 20  # /proc/sys/fs/pipe-max-size's default
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, spelled out for older Pythons
_DEFAULTS = (
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGCHLD,
)


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
    import threading

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


def dial_proxy(path: str) -> _socket.socket:
    """A TCP connection to the proxy, made on the host and handed over ``path``.

    The host relay (relay.py) answers each connection on its unix socket with
    one byte carrying, as SCM_RIGHTS, a TCP socket it connected to the proxy,
    then closes.  The proxy's peer is thus the launcher's socket (same uid, the
    host's loopback) exactly as before, but the bytes skip the host hop: the
    sandbox reads and writes the proxy connection itself.  A connected TCP
    socket cannot be pointed anywhere else, so this grants nothing the relayed
    bytes did not.  OSError when no socket comes.
    """
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
        _, ancdata, _, _ = s.recvmsg(1, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC)
    finally:
        s.close()
    fds = [
        int.from_bytes(data[i : i + 4], sys.byteorder, signed=True)
        for level, kind, data in ancdata
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
        for i in range(0, len(data) - 3, 4)
    ]
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise OSError(errno.ECONNREFUSED, "the host relay could not reach the proxy")
    try:
        return _socket.socket(fileno=fds[0])
    except OSError:
        os.close(fds[0])  # not a socket after all
        raise


def _listen(port: int) -> _socket.socket:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    s.setblocking(False)
    return s


def _parse(argv: list[str]) -> tuple[dict[int, str], int, bool, list[str]]:
    routes: dict[int, str] = {}
    control = -1
    own_group = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--listen" and i + 1 < len(argv):
            port, _, path = argv[i + 1].partition("=")
            routes[int(port)] = path
            i += 2
        elif argv[i] == "--control" and i + 1 < len(argv):
            control = int(argv[i + 1])
            i += 2
        elif argv[i] == "--own-group":
            own_group = True
            i += 1
        else:
            raise ValueError(f"unexpected argument {argv[i]!r}")
    cmd = argv[i + 1 :]
    if control < 0 or not cmd:
        raise ValueError("usage: forwarder.py [--listen PORT=SOCKET]... --control FD -- CMD...")
    return routes, control, own_group, cmd


def _spawn(cmd: list[str], own_group: bool) -> int:
    """Start the command: default signals, an empty mask, its own group only without a tty.

    posix_spawnp, not fork: no copy of this process (page tables, at-fork
    hooks) between the go byte and the command.  OSError if it cannot start.
    """
    if own_group:
        return os.posix_spawnp(
            cmd[0], cmd, os.environ, setsigdef=_DEFAULTS, setsigmask=(), setpgroup=0
        )
    return os.posix_spawnp(cmd[0], cmd, os.environ, setsigdef=_DEFAULTS, setsigmask=())


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def serve(routes: dict[int, str], control: int, own_group: bool, cmd: list[str]) -> int:
    """Listen, wait for go, run ``cmd``, relay until it ends; its exit status."""
    socks: dict[int, _socket.socket] = {}
    listeners: dict[int, str] = {}
    for port, path in routes.items():
        listener = _listen(port)
        socks[listener.fileno()] = listener
        listeners[listener.fileno()] = path
    if os.read(control, 1) != b"g":
        return 125  # the launcher gave up before the session started
    # The SIGCHLD wake-up: a pipe the handler's C side writes (set_wakeup_fd).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        child = _spawn(cmd, own_group)
    except FileNotFoundError:
        os.write(2, f"agent-sandbox: {cmd[0]}: command not found\n".encode())
        return 127
    except OSError as exc:
        os.write(2, f"agent-sandbox: {cmd[0]}: {exc.strerror}\n".encode())
        return 126
    poller = select.poll()
    for fd in (*listeners, control, wake_r):
        poller.register(fd, select.POLLIN)
    while True:
        pid, st = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return _status(st)
        for fd, _ in poller.poll():
            if fd == wake_r:
                os.read(wake_r, 4096)
            elif fd == control:
                data = os.read(control, 64)
                sigs = list(data) if data else [signal.SIGKILL]
                for sig in sigs:
                    _signal(child, own_group, sig)
                if not data:
                    poller.unregister(control)
            else:
                _accept(socks[fd], listeners[fd])


def _signal(child: int, own_group: bool, sig: int) -> None:
    try:
        if own_group:
            os.killpg(child, sig)
        else:
            os.kill(child, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _accept(listener: _socket.socket, path: str) -> None:
    try:
        # _socket's accept: the descriptor (socket.socket.accept wraps it).
        fd, _ = listener._accept()  # type: ignore[attr-defined]
    except BlockingIOError:
        return
    except OSError as exc:
        # Out of descriptors or memory: refuse this connection, keep the session
        # (the command is running); a short pause, as poll would wake at once.
        sys.stderr.write(f"agent-sandbox: proxy bridge cannot accept: {exc.strerror}\n")
        select.select([], [], [], 0.1)
        return
    conn = _socket.socket(fileno=fd)
    try:
        conn.setblocking(True)
        # A relay passes on segments as they come: Nagle would only delay them.
        conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        _start(_bridge, conn, path)
    except OSError as exc:
        sys.stderr.write(f"agent-sandbox: proxy bridge: {exc.strerror}\n")
        conn.close()


def _bridge(conn: _socket.socket, path: str) -> None:
    """One connection: the proxy socket from the host (off the main loop), then pump."""
    try:
        up = dial_proxy(path)
    except OSError as exc:
        sys.stderr.write(f"agent-sandbox: proxy bridge {path}: {exc.strerror}\n")
        conn.close()
        return
    try:
        pump(conn, up)
    except OSError as exc:  # the sockets are closed
        sys.stderr.write(f"agent-sandbox: proxy bridge: {exc.strerror}\n")


def _start(target: object, *args: object) -> None:
    """A daemon thread; OSError (not RuntimeError) when none can start."""
    import threading

    thread = threading.Thread(target=target, args=args, name="pump-dial")  # type: ignore[arg-type]
    thread.daemon = True
    try:
        thread.start()
    except RuntimeError as exc:
        raise OSError(errno.EAGAIN, f"cannot start a relay thread: {exc}") from None


def main(argv: list[str]) -> int:
    try:
        routes, control, own_group, cmd = _parse(argv)
        return serve(routes, control, own_group, cmd)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"agent-sandbox: sandbox bridge: {exc}\n")
        return 125


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: relay threads may still be in a splice
