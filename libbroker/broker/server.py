"""The broker server: a unix socket, one sandboxed command per connection.

The I/O shell around :mod:`libbroker.broker.connection`: binds the socket (0600,
replacing a stale one, never a live one), accepts connections until SIGTERM
or SIGINT, then ends every running command, waits for each to be reaped and
removes the socket.  The server owns every connection it starts
(:class:`Connections`) and awaits them on every path out.  Single-threaded on
purpose: the Landlock backend forks this process for every command, which is
only sound without other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import sys

from libbroker.broker.connection import Connection, Settings
from libbroker.errors import UsageError
from libbroker.server_lines import listening_line
from libbroker.unix_listen import handed_over, listen_unix

SHUTDOWN_GRACE = 5.0
ACCEPT_BACKOFF = 0.1


def bind_socket(path: str) -> socket.socket:
    """broker-server's listening socket at ``path`` (:func:`libbroker.unix_listen.listen_unix`)."""
    return listen_unix(path, 512)


def inherited_socket(fd: int) -> socket.socket:
    """The handed-over listening unix socket ``fd`` (``--socket-fd``, docs/fast-start.md).

    Whoever started the server bound it (mode 0600 is theirs to set) and made
    it listen, so a connection made before the server runs waits in its
    backlog.  Anything else (a descriptor of stdio, a file, a TCP socket, a
    socket not listening, one bound to no path, a closed descriptor) is refused
    by name (:func:`libbroker.unix_listen.handed_over`).
    """
    sock = handed_over(fd, "--socket-fd", (socket.AF_UNIX,), "unix socket bound to a path",
                       UsageError, lambda name: isinstance(name, str) and bool(name))
    sock.setblocking(False)
    return sock


def remove_own_socket(path: str, identity: tuple[int, int]) -> None:
    """Unlink ``path`` only if it is still the socket we bound (device, inode).

    Someone may have replaced it meanwhile (another server after ``rm``, or
    a plain file): that is theirs, not ours to remove.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == identity:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class Connections:
    """The server's live connections: it starts each one and owns its end.

    Trio's rule (whoever starts a handler owns its end on every path): a
    connection is the server's from :meth:`start` until its ``done`` resolves,
    and :meth:`close` stops and awaits every one still live, whatever ended
    the serving (a signal, an error, a cancellation).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.live: set[Connection] = set()

    def start(self, sock: socket.socket) -> None:
        conn = Connection(sock, self.settings)
        self.live.add(conn)
        conn.done.add_done_callback(lambda _: self.live.discard(conn))
        conn.start()

    async def close(self, grace: float) -> None:
        """End every running command; wait up to ``grace`` seconds for each to be reaped."""
        for conn in list(self.live):
            if not conn.done.done():
                conn.stop()
        pending = [conn.done for conn in self.live if not conn.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=grace)


async def serve(path: str, settings: Settings, fd: int = -1) -> None:
    """Serve until SIGTERM/SIGINT; then end every command and remove the socket.

    ``fd`` >= 0: serve the handed-over socket instead of binding ``path``; it
    is left where it is at the end (whoever bound it removes it).
    """
    loop = asyncio.get_running_loop()
    if fd >= 0:
        sock = inherited_socket(fd)
        path = sock.getsockname()
        identity = (-1, -1)
    else:
        sock = bind_socket(path)
        st = os.lstat(path)
        identity = (st.st_dev, st.st_ino)
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    connections = Connections(settings)

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE and the like: the socket stays readable, so pause
                # accepting a moment instead of spinning; say so.
                sys.stderr.write(f"broker-server: accept failed: {exc.strerror}\n")
                loop.remove_reader(sock.fileno())
                loop.call_later(ACCEPT_BACKOFF, resume)
                return
            connections.start(conn)

    def resume() -> None:
        if not stopping.is_set() and sock.fileno() >= 0:  # not once serving has ended
            loop.add_reader(sock.fileno(), accept)

    try:
        loop.add_reader(sock.fileno(), accept)
        sys.stdout.write(listening_line(f"unix:{path}"))
        sys.stdout.flush()
        await stopping.wait()
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
        try:
            await connections.close(SHUTDOWN_GRACE)
        finally:
            if fd < 0:
                remove_own_socket(path, identity)
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)


def run_server(
    *,
    socket_path: str | None,
    workdir: str,
    sandbox: str = "auto",
    profile_path: str | None = None,
    env_allow: str | None = None,
    sign_keys: tuple[str, ...] = (),
    audit_path: str | None = None,
    socket_fd: int = -1,
) -> int:
    """Build everything from the command line's values and serve; return 0 on a clean stop."""
    import shutil

    from libbroker.broker.audit import AuditLog
    from libbroker.broker.executor_choice import make_executor
    from libbroker.broker.ops import sign_key_problem
    from libbroker.broker.profile import default_profile, load_profile, with_env_allow
    from libbroker.errors import ConfigError

    real_workdir = os.path.realpath(workdir)
    if not os.path.isdir(real_workdir):
        raise ConfigError(f"--workdir {workdir} is not a directory")
    if socket_fd >= 0:  # checked before anything else is built
        inherited_socket(socket_fd).detach()
        socket_path = ""
    elif not socket_path:
        raise ConfigError("one of --socket or --socket-fd is needed")
    elif not socket_path.startswith("/"):
        socket_path = os.path.abspath(socket_path)
    profile = load_profile(profile_path) if profile_path else default_profile()
    if env_allow is not None:
        profile = with_env_allow(profile, [n for n in env_allow.split(",") if n])
    for key in sign_keys:
        problem = sign_key_problem(key)
        if problem is not None:
            raise ConfigError(f"--sign-key {key!r} {problem}: not a key id, fingerprint or user id")
    executor = make_executor(sandbox, profile, real_workdir, os.environ)
    audit = AuditLog(audit_path)
    settings = Settings(
        workdir=real_workdir,
        executor=executor,
        audit=audit,
        sign_keys=frozenset(sign_keys),
        gpg=shutil.which("gpg") if sign_keys else None,
    )
    try:
        asyncio.run(serve(socket_path, settings, socket_fd))
    finally:
        executor.close()
        audit.close()
    return 0
