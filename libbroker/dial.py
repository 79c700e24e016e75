"""Reaching the broker's socket, with C modules only.

broker-client and gpg-shim both connect here.  gpg-shim runs once per
signature git asks for, so this module imports ``_socket`` (the C module;
``socket`` costs an ``enum`` import and several enum conversions) and
nothing else beyond :mod:`libbroker.errors`: not even ``os``.
"""

from __future__ import annotations

import _socket

from libbroker.errors import BrokerUnavailable

SOCKET_ENV_VAR = "AGENT_SANDBOX_BROKER_SOCKET"


def dial(path: str, send_buffer: int = 0) -> _socket.socket:
    """A connected unix stream socket to the broker at ``path``, or BrokerUnavailable.

    ``send_buffer`` (bytes), when given, is asked for before connecting; a
    refusal is harmless.
    """
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError as exc:
        why = f"cannot create a unix socket to reach the broker at {path}: {exc.strerror or exc}"
        if isinstance(exc, PermissionError):
            # A seccomp filter refuses unix sockets here: this is a command the
            # broker itself runs (Landlock), which has no broker of its own.
            why += "; run broker-client from the session's own shell, not from a brokered command"
        raise BrokerUnavailable(why) from None
    try:
        if send_buffer:
            try:  # noqa: SIM105 - contextlib.suppress costs an import on every call
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, send_buffer)
            except OSError:
                pass
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        raise BrokerUnavailable(
            f"broker socket {path} does not exist: is broker-server running?"
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise BrokerUnavailable(f"no broker is listening on {path}: restart the session") from None
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise BrokerUnavailable(f"cannot reach the broker at {path}: {reason}") from None
    return sock
