"""A listening unix socket at a path, mode 0600: a stale one replaced, a live one refused.

The one binding of broker-server's socket, egress-proxy's ``--control``
socket and the resident service's (``agent-sandbox serve``), and the one check
of a listening socket handed over to a server (:func:`handed_over`:
broker-server's ``--socket-fd``, egress-proxy's ``--listen-fd``).  It lives in
libbroker's base because libegress may use nothing else of libbroker; it is
the base's one module that touches a socket (the stdlib's, no more), and only
the servers import it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Callable

from libbroker.errors import AgentSandboxError, SocketInUse, UsageError


class LiveSocket(SocketInUse):
    """A server answers at the path: it is not taken over."""


def listen_unix(path: str, backlog: int,
                on_stale: Callable[[], None] | None = None) -> socket.socket:
    """A non-blocking socket listening at ``path``, mode 0600 from its first moment.

    A socket nobody answers on (left by a server that died) is replaced; a
    live one is refused, and so is anything at the path that is not a socket.
    Every refusal is a :class:`SocketInUse` that names the path; ``on_stale``
    is called when a stale socket was replaced.
    """
    if _clear_stale(path) and on_stale is not None:
        on_stale()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # no window in which the socket is wider than 0600
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise SocketInUse(f"cannot bind {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _clear_stale(path: str) -> bool:
    """Whether a stale socket was there (and is gone now)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SocketInUse(f"cannot look at {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; not replacing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # stale: left behind by a server that died
            return True
        except OSError as exc:
            raise SocketInUse(f"cannot probe {path}: {exc.strerror or exc}") from None
    raise LiveSocket(f"a server is already listening on {path}; not taking it over")


def listen_for_service(path: str, say: Callable[[str], None]) -> socket.socket:
    """A resident service's socket at ``--socket`` ``path``; UsageError, one line, when taken."""
    try:
        return listen_unix(path, 128, lambda: say(f"replaced a stale socket at {path}"))
    except LiveSocket:
        raise UsageError(f"--socket {path}: a service already listens there") from None
    except SocketInUse as exc:
        raise UsageError(f"--socket: {exc}") from None


def handed_over(fd: int, option: str, families: tuple[int, ...], what: str,
                error: type[AgentSandboxError],
                named: Callable[[object], bool] = bool) -> socket.socket:
    """The listening stream socket ``fd`` that whoever started the server handed over.

    Only a stream socket of one of ``families`` that already listens, with a
    local address ``named`` accepts, is taken; anything else (stdio, a file,
    another family, a socket not listening, a closed descriptor) is ``error``,
    one line naming ``option`` and ``what`` it must be, and ``fd`` is left as it
    was.  A connection made before the server ran waits in the socket's backlog.
    """
    if fd < 3:
        raise error(f"{option}={fd}: not a handed-over socket (0-2 are stdio)")
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise error(f"{option}={fd}: {exc.strerror or exc}") from None
    try:
        ok = (sock.family in families and sock.type == socket.SOCK_STREAM
              and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
              and named(sock.getsockname()))
    except OSError:
        ok = False
    if not ok:
        sock.detach()
        raise error(f"{option}={fd}: not a listening {what}")
    return sock
