"""The GitHub token: read from ``--token-command``, kept in memory, renewed.

The command runs on the host (never a shell: its argv is split with shlex), in
a session and process group of its own, with a bounded run time.  Its first
output line is the token.  A failed read keeps the token held so far and is
retried with back-off; what happened is reported through ``say`` without the
token or the command's output, which could hold it.

Ownership of the command's processes: when a read ends, however it ends (the
command exited, the run bound passed, the proxy is stopping and cancels the
read), the command's whole process group gets SIGKILL and the command itself
is reaped.  The read never waits for the pipe to close: a grandchild that
keeps stdout open (``sh -c 'sleep 600; echo tok'``) can neither hold a read
past its bound nor outlive it.  A descendant that leaves the group on purpose
(``setsid``) is beyond the reach of a process group and is not tracked here.

When the proxy itself is killed (SIGKILL: none of the above runs), the
command gets SIGKILL from the kernel (``PR_SET_PDEATHSIG``, set between fork
and exec), and the rest is its owner's: ``agent-sandbox run`` is a child
subreaper, so what is left of the command (its group, a ``setsid`` escape)
becomes the launcher's and is killed at the session's end
(:meth:`libbroker.launcher.session_box.Box.reap`).

Start-up: ``listening`` waits for the first token at most :data:`FIRST_WAIT`
seconds, so the first GitHub request already carries it.  A slower command
goes on in the background (still under its run bound) while the proxy serves
without a token, and renewal takes over from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from libbroker.errors import TokenError
from libegress.token_command import token_argv as token_argv  # re-exported: its old home

if TYPE_CHECKING:
    # Loaded with --secrets only (libegress.app.read_secrets), and with them the
    # logins' modules (oauth_login, token_endpoint, placeholders): a proxy
    # without secrets never pays for them.
    from libegress.secrets import Secret

# Printable ASCII without spaces: whatever goes into a header must not be able
# to end it (no CR/LF) or be mistaken for another field.
_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
RUN_BOUND = 30.0
# Below the launcher's default start timeout (10 s), which waits on `listening`.
FIRST_WAIT = 5.0
BACKOFF = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
MAX_OUTPUT = 64 * 1024
# Without a pidfd (kernels before 5.3) the command's exit is polled this often.
_POLL = 0.1


_PR_SET_PDEATHSIG = 1


def _die_with_us() -> Callable[[], None]:
    """What the command runs between fork and exec: SIGKILL when the proxy's thread ends.

    The one Python run between fork and exec (``preexec_fn``), kept to a libc
    call resolved here, in the parent, as the proxy has threads (its TLS
    pool).  The reads run on the event loop's thread, the main one, which
    lives as long as the proxy.  A proxy already gone (the race before the
    prctl) ends the command at once.  ctypes is imported on the first read,
    not at the proxy's start.
    """
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with


class CommandFailed(TokenError):
    """The command ran and exited with a status other than 0."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the token command exited with status {status}")
        self.status = status


def parse_token(output: bytes) -> str:
    """The token in a command's output: its first line, stripped."""
    text = output.decode("ascii", "replace").strip()
    first = text.splitlines()[0].strip() if text else ""
    if not _TOKEN.match(first):
        raise TokenError("the token command printed no usable token")
    return first


async def read_token(argv: list[str], bound: float = RUN_BOUND,
                     env: Mapping[str, str] | None = None) -> str:
    """Run the token command once and return its token.

    ``env``: the command's environment (a gateway tenant's own); None inherits ours.
    """
    return parse_token(await run_command(argv, bound, env=env))


# What a command may be handed on its standard input: one pipe's worth, written
# before it starts, so neither side can wait on the other.
MAX_INPUT = 60 * 1024


async def run_command(argv: list[str], bound: float = RUN_BOUND, stdin: bytes = b"",
                      env: Mapping[str, str] | None = None) -> bytes:
    """Run ``argv`` once (``stdin`` as its input) and return what it printed.

    TokenError when it cannot start, runs past ``bound``, prints more than
    :data:`MAX_OUTPUT` or exits with a status other than 0.
    """
    if len(stdin) > MAX_INPUT:
        raise TokenError(f"the command's input is over {MAX_INPUT // 1024} KiB")
    in_read: int = subprocess.DEVNULL
    try:
        if stdin:
            in_read, in_write = os.pipe()
            try:
                os.write(in_write, stdin)  # fits the pipe: MAX_INPUT
            finally:
                os.close(in_write)
        read_end, write_end = os.pipe()
    except OSError as exc:  # out of descriptors, say
        if stdin and in_read >= 0:
            os.close(in_read)
        raise TokenError(f"the token command could not start: {exc.strerror}") from None
    try:
        proc = subprocess.Popen(argv, stdin=in_read, stdout=write_end,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env=None if env is None else dict(env),
                                preexec_fn=_die_with_us())
    except (OSError, ValueError) as exc:
        os.close(read_end)
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise TokenError(f"the token command could not start: {reason}") from None
    finally:
        # Only the command holds the write end now: its exit (and its
        # descendants') is what ends the output.
        os.close(write_end)
        if stdin:
            os.close(in_read)
    try:
        os.set_blocking(read_end, False)
        async with asyncio.timeout(bound):
            out = await _output_until_exit(proc.pid, read_end)
    except TimeoutError:
        raise TokenError(f"the token command ran longer than {bound:g}s: "
                         "its process group was killed") from None
    finally:
        os.close(read_end)
        _end(proc)
    if proc.returncode != 0:
        raise CommandFailed(proc.returncode)
    return out


async def _output_until_exit(pid: int, fd: int) -> bytes:
    """What the command printed until it exited (not yet reaped: its pid stays ours).

    Waits for the command's exit, not for the end of its output: a descendant
    may hold stdout open for as long as it likes.
    """
    out = bytearray()
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    watched = [fd]
    try:
        while not _exited(pid):
            await _readable(watched + ([pidfd] if pidfd is not None else []),
                            None if pidfd is not None else _POLL)
            if fd in watched and not _drain(fd, out):
                watched = []  # end of output: only the exit is awaited now
        _drain(fd, out)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return bytes(out)


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the command a zombie: its pid (and so its process group's
    # id) cannot be reused before _end has killed the group.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _drain(fd: int, out: bytearray) -> bool:
    """Read what is buffered into ``out``; False at the end of the output."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        out += chunk
        if len(out) > MAX_OUTPUT:
            raise TokenError(f"the token command printed more than {MAX_OUTPUT // 1024} KiB")


async def _readable(fds: list[int], timeout: float | None) -> None:
    """Wait until one of ``fds`` is readable (or ``timeout`` passes)."""
    loop = asyncio.get_running_loop()
    wake: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not wake.done():
            wake.set_result(None)

    for fd in fds:
        loop.add_reader(fd, ready)
    try:
        if timeout is None:
            await wake
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake, timeout)
    finally:
        for fd in fds:
            loop.remove_reader(fd)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of the command's process group, then reap the command."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    # The command has exited or was just killed: the wait is a matter of
    # milliseconds.  Blocking for it is simpler and safer than an await that a
    # second cancellation (the proxy stopping) could cut short.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=2.0)


class TokenKeeper:
    """Holds the current token and renews it until cancelled."""

    def __init__(
        self,
        argv: list[str] | None,
        every: float,
        say: Callable[[str], None],
        bound: float = RUN_BOUND,
        backoff: tuple[float, ...] = BACKOFF,
        first_wait: float = FIRST_WAIT,
        env: Mapping[str, str] | None = None,
        quiet_status: int | None = None,
        login_file: str = "",
    ) -> None:
        self._argv = argv
        self._quiet = quiet_status  # an exit status that means "nothing yet", not a failure
        self._login_file = login_file  # a login keeper's file: not run while it is absent
        self._env = env
        self._every = every
        self._say = say
        self._bound = bound
        self._backoff = backoff
        self._first_wait = first_wait
        self._first: asyncio.Task[bool] | None = None
        self._token: str | None = None

    def current(self) -> str | None:
        """The token now, or None while there is none."""
        return self._token

    async def refresh(self) -> bool:
        """One read: True on success; a failure keeps the held token."""
        if self._argv is None:
            return False
        if self._login_file and _absent(self._login_file):
            # No login yet: the keeper (a Python start, ~40 ms of CPU) would only
            # exit with its quiet status, and a run in flight at the session's
            # end makes the proxy's stop a graceful one.  The same back-off.
            return False
        try:
            self._token = await read_token(self._argv, self._bound, self._env)
        except TokenError as exc:
            if isinstance(exc, CommandFailed) and exc.status == self._quiet:
                return False
            kept = "the previous token is kept" if self._token else "no token is held"
            self._say(f"token renewal failed: {exc}; {kept}")
            return False
        return True

    async def start(self) -> None:
        """The first read, awaited at most ``first_wait`` seconds.

        A longer read goes on (under its run bound) and :meth:`keep` takes it
        over; cancelling this cancels the read.
        """
        if self._argv is None:
            return
        first = self._first = asyncio.create_task(self.refresh())
        try:
            done, _ = await asyncio.wait({first}, timeout=self._first_wait)
        except asyncio.CancelledError:
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            raise
        if not done:
            self._say(f"no token after {self._first_wait:g}s: serving without one while "
                      "the token command runs")

    async def keep(self) -> None:
        """Renew every ``every`` seconds, backing off after failures."""
        if self._argv is None:
            return
        failures = 0
        first, self._first = self._first, None
        try:
            if first is not None and not await first:
                failures = 1
        finally:
            if first is not None and not first.done():
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first
        while True:
            if failures:
                wait = self._backoff[min(failures - 1, len(self._backoff) - 1)]
                wait = min(wait, self._every)
            else:
                wait = self._every
            await asyncio.sleep(wait)
            failures = 0 if await self.refresh() else failures + 1


class SecretKeeper:
    """One ``--secrets`` entry at run time: its runner, and the field it makes.

    The command runs exactly as ``--token-command`` does (a :class:`TokenKeeper`,
    shared by the entries with the same command: :func:`secret_keepers`); what
    is logged names the hosts, never the value.
    """

    def __init__(self, secret: Secret, say: Callable[[str], None],
                 bound: float = RUN_BOUND, first_wait: float = FIRST_WAIT,
                 env: Mapping[str, str] | None = None, *,
                 keeper: TokenKeeper | None = None) -> None:
        self.secret = secret
        self.env = env  # the command's environment: also the login keeper's other runs
        self.name = secret.header.encode("ascii")
        self.lower_name = self.name.lower()
        self.keeper = keeper or _runner([secret], say, bound, first_wait, env)
        self._made: tuple[str, bytes] | None = None

    def field(self) -> tuple[bytes, bytes] | None:
        """The header to set (name, value), or None while no value is held."""
        value = self.keeper.current()
        if value is None:
            return None
        made = self._made
        if made is None or made[0] is not value:
            from libegress.secrets import header_value  # loaded already: a Secret is one of its

            made = self._made = (value, header_value(self.secret.format, value))
        return self.name, made[1]


def secret_keepers(secrets: tuple[Secret, ...] | list[Secret], say: Callable[[str], None],
                   bound: float = RUN_BOUND,
                   env: Mapping[str, str] | None = None) -> dict[str, SecretKeeper]:
    """Each secret's keeper, by host; entries with the same command share one runner.

    An agent's login is one keeper command for several hosts (Gemini CLI's
    three): it prints the same token for each, so it runs once per renewal,
    not once per host (each run is a Python start, ~0.1 s of CPU, at every
    session's start).  Same command means same argv, period and login kind.
    """
    runners: dict[tuple[tuple[str, ...], float, str], list[Secret]] = {}
    for secret in secrets:
        runners.setdefault((tuple(secret.argv), secret.every, secret.login), []).append(secret)
    keepers: dict[str, SecretKeeper] = {}
    for group in runners.values():
        shared = _runner(group, say, bound, FIRST_WAIT, env)
        for secret in group:
            keepers[secret.host] = SecretKeeper(secret, say, bound, env=env, keeper=shared)
    return keepers


def _runner(group: list[Secret], say: Callable[[str], None], bound: float, first_wait: float,
            env: Mapping[str, str] | None) -> TokenKeeper:
    """The one runner of secrets with the same command; its lines name their hosts."""
    from libegress.oauth_login import ABSENT_STATUS  # loaded by secrets already

    first = group[0]
    prefix = "secret for " + ", ".join(s.host for s in group)
    return TokenKeeper(list(first.argv), first.every, lambda message: say(f"{prefix}: {message}"),
                       bound=bound, first_wait=first_wait, env=env,
                       quiet_status=ABSENT_STATUS if first.login else None,
                       login_file=login_file(list(first.argv)) if first.login else "")


def _absent(path: str) -> bool:
    """``path`` does not exist (any other error: the keeper runs and says what it is)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def login_file(argv: list[str]) -> str:
    """The login file of a :mod:`libegress.login_keeper` command (``... -m
    libegress.login_keeper KIND FILE ...``, as libbroker.launcher.logins makes it), else ""."""
    try:
        at = argv.index("libegress.login_keeper")
    except ValueError:
        return ""
    return argv[at + 2] if at > 0 and argv[at - 1] == "-m" and len(argv) > at + 2 else ""


def distinct(keepers: list[TokenKeeper]) -> list[TokenKeeper]:
    """``keepers`` without repeats (a runner shared by secrets runs once), in order."""
    return list({id(k): k for k in keepers}.values())


async def start_all(keepers: list[TokenKeeper]) -> None:
    """Every keeper's first read, side by side (each bounded by its ``first_wait``)."""
    await asyncio.gather(*(k.start() for k in keepers))


async def keep_all(keepers: list[TokenKeeper]) -> None:
    """Every keeper's renewals, until cancelled."""
    await asyncio.gather(*(k.keep() for k in keepers))
