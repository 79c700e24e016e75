"""The in-sandbox side of the network bridge, and the parent of the agent's command.

bwrap runs this file with ``python3 -I -S`` (standard library only, no site,
no environment) as the first process of the sandbox, inside its own network
namespace, where the only interface is loopback.  It:

1. listens on ``127.0.0.1:PORT`` for each ``--listen PORT=SOCKET`` and relays
   every connection over the unix ``SOCKET`` (bind-mounted from the session's
   runtime directory), whose host-side end the launcher connects to the egress
   proxy's TCP port.  So ``HTTPS_PROXY=http://127.0.0.1:3128`` and
   ``ALL_PROXY=socks5h://127.0.0.1:1080`` work inside, and nothing else does;
2. waits for the launcher's go byte on ``--control FD`` (the launcher sends it
   once the proxy and broker listen: the sandbox is built while they start);
3. forks and execs the command, then relays signals: every later byte on the
   control pipe is a signal number for the command (its process group when it
   has one); end of file means the launcher is gone, so the command is killed;
4. exits with the command's status (128+N when signal N ended it).

:func:`pump` is also the launcher's relay loop (host side).
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
# and threading loads with the first connection.

_CHUNK = 1 << 16
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
    """Move bytes src -> dst until src's end of stream, in the kernel if it can."""
    rfd, wfd = os.pipe()
    try:
        while True:
            try:
                n = os.splice(src.fileno(), wfd, _CHUNK)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                break  # this pair cannot splice: fall back to copying
            if n == 0:
                return
            while n:
                n -= os.splice(rfd, dst.fileno(), n)
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


def _half(src: _socket.socket, dst: _socket.socket, done: threading.Event) -> None:
    import contextlib  # with the first connection, like threading

    # A reset or a closed peer ends this direction like an end of file.
    with contextlib.suppress(OSError):
        _copy(src, dst)
    with contextlib.suppress(OSError):
        dst.shutdown(_socket.SHUT_WR)
    if done.is_set():
        src.close()
        dst.close()
    else:
        done.set()


def pump(a: _socket.socket, b: _socket.socket) -> None:
    """Relay two connected sockets both ways on two threads; both close at the end."""
    import threading

    done = threading.Event()
    for src, dst in ((a, b), (b, a)):
        threading.Thread(target=_half, args=(src, dst, done), daemon=True).start()


def _dial_unix(path: str) -> _socket.socket:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


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
    pid = os.fork()
    if pid == 0:  # the command: default signals, its own group only without a tty
        try:
            for sig in _DEFAULTS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            if own_group:
                os.setpgid(0, 0)
            os.execvp(cmd[0], cmd)  # noqa: S606 - the user's command, as given
        except FileNotFoundError:
            os.write(2, f"agent-sandbox: {cmd[0]}: command not found\n".encode())
            os._exit(127)
        except OSError as exc:
            os.write(2, f"agent-sandbox: {cmd[0]}: {exc.strerror}\n".encode())
            os._exit(126)
        os._exit(127)
    return pid


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
    child = _spawn(cmd, own_group)
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
    conn = _socket.socket(fileno=fd)
    conn.setblocking(True)
    try:
        up = _dial_unix(path)
    except OSError as exc:
        sys.stderr.write(f"agent-sandbox: proxy bridge {path} unreachable: {exc.strerror}\n")
        conn.close()
        return
    pump(conn, up)


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
