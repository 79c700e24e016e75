"""Reaching the broker's socket, with C modules only.

broker-client and gpg-shim both connect here.  gpg-shim runs once per
signature git asks for, so this module imports ``_socket`` (the C module;
``socket`` costs an ``enum`` import and several enum conversions), ``posix``
and ``sys`` (built in) and nothing else beyond :mod:`libbroker.errors`.

In a Landlock session no unix socket may be created; the session's broker is
reached through the door instead (:mod:`libbroker.launcher.door`): an
inherited descriptor named by ``AGENT_SANDBOX_BROKER_DOOR``, through which
the launcher hands back a socket it connected to the broker.
"""

from __future__ import annotations

import _socket
import posix
import sys

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
    """The door's descriptor, when there is one and ``path`` is the session's broker."""
    env = posix.environ
    door = env.get(DOOR_ENV_VAR.encode(), b"")
    if not door.isdigit() or env.get(SOCKET_ENV_VAR.encode(), b"").decode(errors="replace") != path:
        return None
    return int(door)


def through_door(door: int) -> _socket.socket:
    """A socket connected to the broker, asked for through the door at fd ``door``."""
    try:
        gate = _socket.socket(fileno=posix.dup(door))
    except OSError as exc:
        raise BrokerUnavailable(
            f"the broker door (descriptor {door}, {DOOR_ENV_VAR}) is not open here: "
            f"{exc.strerror or exc}; a parent process closed it (Python's subprocess does: "
            f"pass_fds=({door},) keeps it)"
        ) from None
    mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        passed = theirs.fileno().to_bytes(4, sys.byteorder)
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, passed)]
        try:
            gate.sendmsg([b"\0"], rights)
        except OSError as exc:
            raise BrokerUnavailable(
                f"cannot use the broker door (descriptor {door}): {exc.strerror or exc}"
            ) from None
        theirs.close()
        mine.settimeout(_DOOR_TIMEOUT)
        try:
            data, ancillary, _, _ = mine.recvmsg(
                256, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC
            )
        except OSError as exc:
            raise BrokerUnavailable(f"the broker door did not answer: {exc}") from None
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(payload) >= 4:
                return _socket.socket(fileno=int.from_bytes(payload[:4], sys.byteorder))
        reason = data[1:].decode(errors="replace") or "the session is ending"
        raise BrokerUnavailable(f"the broker door refused: {reason}")
    finally:
        theirs.close()
        mine.close()
        gate.close()
