"""The GitHub token: read from ``--token-command``, kept in memory, renewed.

The command runs on the host (never a shell: its argv is split with shlex), with
a bounded run time.  Its first output line is the token.  A failed read keeps
the token held so far and is retried with back-off; what happened is reported
through ``say`` without the token or the command's output, which could hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
from collections.abc import Callable

from libbroker.errors import TokenError, UsageError

# Printable ASCII without spaces: whatever goes into a header must not be able
# to end it (no CR/LF) or be mistaken for another field.
_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
RUN_BOUND = 30.0
BACKOFF = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)


def token_argv(command: str) -> list[str]:
    """The argv of ``--token-command``; refused when empty or unbalanced."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--token-command cannot be split: {exc}") from None
    if not argv:
        raise UsageError("--token-command is empty")
    return argv


def parse_token(output: bytes) -> str:
    """The token in a command's output: its first line, stripped."""
    text = output.decode("ascii", "replace").strip()
    first = text.splitlines()[0].strip() if text else ""
    if not _TOKEN.match(first):
        raise TokenError("the token command printed no usable token")
    return first


async def read_token(argv: list[str], bound: float = RUN_BOUND) -> str:
    """Run the token command once and return its token."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        raise TokenError(f"the token command could not start: {exc.strerror}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), bound)
    except TimeoutError:
        raise TokenError(f"the token command ran longer than {bound:g}s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise TokenError(f"the token command exited with status {proc.returncode}")
    return parse_token(out)


class TokenKeeper:
    """Holds the current token and renews it until cancelled."""

    def __init__(
        self,
        argv: list[str] | None,
        every: float,
        say: Callable[[str], None],
        bound: float = RUN_BOUND,
        backoff: tuple[float, ...] = BACKOFF,
    ) -> None:
        self._argv = argv
        self._every = every
        self._say = say
        self._bound = bound
        self._backoff = backoff
        self._token: str | None = None

    def current(self) -> str | None:
        """The token now, or None while there is none."""
        return self._token

    async def refresh(self) -> bool:
        """One read: True on success; a failure keeps the held token."""
        if self._argv is None:
            return False
        try:
            self._token = await read_token(self._argv, self._bound)
        except TokenError as exc:
            kept = "the previous token is kept" if self._token else "no token is held"
            self._say(f"token renewal failed: {exc}; {kept}")
            return False
        return True

    async def keep(self) -> None:
        """Renew every ``every`` seconds, backing off after failures."""
        if self._argv is None:
            return
        failures = 0
        while True:
            if failures:
                wait = self._backoff[min(failures - 1, len(self._backoff) - 1)]
                wait = min(wait, self._every)
            else:
                wait = self._every
            await asyncio.sleep(wait)
            failures = 0 if await self.refresh() else failures + 1
