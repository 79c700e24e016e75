"""One log line per refused or failed connection (and, asked to, per allowed one).

Lines name the host, port, reason (or mode) and the peer's pid; never a
header, a body or the token.  Host and reason can carry text from the sandbox, so anything
outside printable ASCII is escaped: a line cannot be split or forged.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from libegress.outcome import Mode, Outcome

if TYPE_CHECKING:
    from libegress.record import Recorder


def _clean(text: str) -> str:
    return "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)


class EventLog:
    """Writes log lines to a stream (stderr, or the ``--log`` file)."""

    def __init__(self, stream: TextIO | None = None, *, log_allowed: bool = False,
                 tenant: str | None = None, copy_fd: int = -1) -> None:
        self._stream = stream
        # A gateway tenant's own log (its session's launcher reads it): each line
        # goes there too, non-blocking; a line with no room is dropped, never waited for.
        self.copy_fd = copy_fd
        # A gateway tenant's lines say whose they are (names are checked: no spaces).
        self._tag = f"tenant={tenant} " if tenant else ""
        self._log_allowed = log_allowed
        self.record: Recorder | None = None  # --record: refusals and failures go there too

    def report(self, outcome: Outcome, pid: int | None) -> None:
        """A refused, failed or limited connection or request: a line, and the record's.

        ``outcome.method`` is the refused request's, when one was read (plain
        HTTP and inside an inject host's tunnel); a tunnel is refused before any.
        """
        if self.record is not None:
            self.record.event(outcome)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        method = outcome.method
        verb = "" if method is None else f"method={_clean(method[:16].decode('latin-1'))} "
        text = (
            f"{stamp} egress-proxy {outcome.verdict} {self._tag}"
            f"host={_clean(outcome.host) or '-'} port={outcome.port} "
            f"pid={pid if pid is not None else '-'} {verb}reason={_clean(outcome.text)}\n"
        )
        self._write(text)

    def allowed(self, host: str, port: int, mode: Mode,
                find_pid: Callable[[], int | None]) -> None:
        """With ``--log-allowed``: a connection to ``host``:``port`` was let through.

        The line says ``mode.log_word``: ``raw`` (CONNECT tunnel), ``socks``
        (SOCKS tunnel), ``intercept`` (TLS terminated, token set) or ``http``
        (plain HTTP).  ``find_pid`` (the peer's :meth:`~libegress.context.Peer.pid`)
        is called for that line only: its scan of /proc costs ~4 ms of CPU with
        100 processes, more on a busy machine, and without --log-allowed (a
        session's proxy) nothing would read the pid.
        """
        if self._log_allowed:
            pid = find_pid()
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._write(
                f"{stamp} egress-proxy allowed {self._tag}host={_clean(host) or '-'} port={port} "
                f"pid={pid if pid is not None else '-'} mode={mode.log_word}\n"
            )

    def note(self, message: str) -> None:
        """A line about the proxy itself (token renewal, start-up)."""
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._write(f"{stamp} egress-proxy note {self._tag}{_clean(message)}\n")

    def close_copy(self) -> None:
        """Close the tenant's own log (the tenant was removed, or its add failed)."""
        if self.copy_fd >= 0:
            os.close(self.copy_fd)
            self.copy_fd = -1

    def _write(self, text: str) -> None:
        if self.copy_fd >= 0:
            # Full (a stalled reader) or gone: the gateway's own stream still has it.
            with contextlib.suppress(OSError):
                os.write(self.copy_fd, text.encode())
        stream = self._stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass
