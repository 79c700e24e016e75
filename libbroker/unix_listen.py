"""A listening unix socket at a path, mode 0600: a stale one replaced, a live one refused.

The one binding of broker-server's socket, egress-proxy's ``--control``
socket and the resident service's (``agent-sandbox serve``).  It lives in
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

from libbroker.errors import SocketInUse, UsageError


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
