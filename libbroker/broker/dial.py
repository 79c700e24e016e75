"""Reaching the broker's socket, with C modules only.

broker-client and gpg-shim both connect here.  gpg-shim runs once per
signature git asks for, so this module imports ``_socket`` (the C module;
``socket`` costs an ``enum`` import and several enum conversions), ``posix``
and ``sys`` (built in) and nothing else beyond :mod:`libbroker.errors`.

In a Landlock session no unix socket may be created; the session's broker is
reached through the door instead (:mod:`libbroker.launcher.door`): a loopback
TCP port named by ``AGENT_SANDBOX_BROKER_DOOR``, which the launcher relays
to the broker's socket.
"""

from __future__ import annotations

import _socket
import posix

from libbroker.errors import BrokerUnavailable

SOCKET_ENV_VAR = "AGENT_SANDBOX_BROKER_SOCKET"
DOOR_ENV_VAR = "AGENT_SANDBOX_BROKER_DOOR"
_DOOR_TIMEOUT = 30.0  # the launcher answers in a connect() to a local socket


def dial(path: str, send_buffer: int = 0) -> _socket.socket:
    """A connected unix stream socket to the broker at ``path``, or BrokerUnavailable.

    ``send_buffer`` (bytes), when given, is asked for before connecting; a
    refusal is harmless.  The session's own broker is reached through the
    door when there is one.
    """
    door = _door_for(path)
    if door is not None:
        sock = through_door(door)
        _ask_send_buffer(sock, send_buffer)
        return sock
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


def _ask_send_buffer(sock: _socket.socket, size: int) -> None:
    if size:
        try:  # noqa: SIM105 - contextlib.suppress costs an import on every call
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, size)
        except OSError:
            pass


def _door_for(path: str) -> int | None:
    """The door's port, when there is one and ``path`` is the session's broker."""
    env = posix.environ
    door = env.get(DOOR_ENV_VAR.encode(), b"")
    if not door.isdigit() or env.get(SOCKET_ENV_VAR.encode(), b"").decode(errors="replace") != path:
        return None
    port = int(door)
    return port if 0 < port < 65536 else None


def through_door(port: int) -> _socket.socket:
    """A connection to the broker through the launcher's door at ``127.0.0.1:port``."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.settimeout(_DOOR_TIMEOUT)
        sock.connect(("127.0.0.1", port))
        sock.settimeout(None)
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise BrokerUnavailable(
            f"cannot reach the broker through the session's door (127.0.0.1:{port}, "
            f"{DOOR_ENV_VAR}): {reason}; is the session still running?"
        ) from None
    return sock
