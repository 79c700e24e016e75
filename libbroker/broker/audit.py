"""The broker's audit trail: one JSON object per line, per request.

Lines carry what was asked and what came of it (time, peer pid/uid, op, argv,
cwd, exit or refusal, duration), never the command's input or output.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from libbroker.server_lines import event_line


class AuditLog:
    """Appends JSON lines to a file (0600) and mirrors refusals to stderr.

    Fail closed: once a line could not be written (disk full, I/O error), the
    log is :attr:`broken` and the server refuses new requests until a line
    (a refusal's) is written again; a command is never started unaudited
    knowingly.  The command whose own line failed has already run; that is
    said on stderr.
    """

    def __init__(self, path: str | None) -> None:
        self.broken: str | None = None
        self._file: TextIO | None = None
        if path is not None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def record(self, **fields: object) -> None:
        """Write one line; a refusal is also logged on stderr."""
        entry: dict[str, object] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        entry.update(fields)
        if "refused" in entry:
            sys.stderr.write(
                f"broker-server: refused peer pid {entry.get('peer_pid')}: {entry['refused']}\n"
            )
        if self._file is not None:
            try:
                self._file.write(event_line(entry))
                self._file.flush()
            except OSError as exc:
                self.broken = exc.strerror or str(exc)
                sys.stderr.write(f"broker-server: cannot write the audit log: {self.broken}\n")
            else:
                self.broken = None

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:  # lines held back by a full disk are lost: say so
                sys.stderr.write(f"broker-server: cannot write the audit log: {exc.strerror}\n")
            self._file = None
