"""The broker's audit trail: one JSON object per line, per request.

Lines carry what was asked and what came of it (time, peer pid/uid, op, argv,
cwd, exit or refusal, duration), never the command's input or output.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TextIO


class AuditLog:
    """Appends JSON lines to a file (0600) and mirrors refusals to stderr."""

    def __init__(self, path: str | None) -> None:
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
                self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
            except OSError as exc:
                sys.stderr.write(f"broker-server: cannot write the audit log: {exc.strerror}\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
