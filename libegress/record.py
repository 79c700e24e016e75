"""``--record FILE``: one JSON line per egress decision, for the launcher's session record.

A line is written when a connection (tunnel) or a request (inject hosts and
plain HTTP) ends, or when something is refused: host, port, kind (``tunnel``,
``socks``, ``injected``, ``plain``), verdict (``allowed``, ``refused``,
``failed``, ``limit``), reason, body bytes each way (``up`` from the
sandbox, ``down`` to it), duration; method, path (never the query) and status
for requests.  Never a header value, a body or a token.  With ``--learn``,
an event for a host the allow list would have refused carries ``learn``.
In gateway mode every line names its tenant (``tenant``, right after ``ev``),
so tenants that share one stream (a pod's stdout) can be told apart.

Cheap on purpose: nothing per chunk, one ``json.dumps`` and one ``write``
per connection or request.  A line longer than PIPE_BUF cannot happen (the
path is cut), so lines on a pipe never interleave.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from libbroker.server_lines import event_line
from libegress.allowlist import allowed
from libegress.outcome import Mode, Outcome, Verdict
from libegress.route import EgressPolicy

if TYPE_CHECKING:  # http1 loads asyncio and h11: after the proxy's `listening` line
    from libegress.http1 import Exchanged

_PATH_MAX = 256
LEARN_MARK = "not on the allow list"


def _clean(text: str, limit: int = 512) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)


def request_path(target: bytes) -> str:
    """The path of an origin-form target, without its query (which may carry a secret)."""
    path = target.split(b"?", 1)[0].split(b"#", 1)[0]
    text = path.decode("ascii", "replace")
    return _clean(text, _PATH_MAX) + ("?..." if b"?" in target else "")


class Recorder:
    """Writes event lines to ``--record``'s file; does nothing without one."""

    def __init__(self, fd: int | None, policy: EgressPolicy, tenant: str | None = None) -> None:
        self._fd = fd
        self._policy = policy
        self._tenant = tenant
        self.failed: str | None = None

    @classmethod
    def open(cls, path: str | None, policy: EgressPolicy,
             tenant: str | None = None) -> Recorder:
        """The recorder for ``path`` (appended, 0600); OSError when it cannot be opened.

        ``tenant``: the gateway's tenant whose lines these are, named in each.
        A gateway never waits on one tenant's reader: its record is opened
        non-blocking, so a FIFO nobody reads is refused (ENXIO) instead of
        hanging the event loop, and a line a stalled reader has no room for is
        dropped (``failed``) rather than stalling every other tenant.
        """
        if path is None:
            return cls(None, policy, tenant)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        if tenant is not None:
            flags |= os.O_NONBLOCK
        fd = os.open(path, flags, 0o600)
        return cls(fd, policy, tenant)

    @property
    def on(self) -> bool:
        return self._fd is not None

    def would_refuse(self, host: str, port: int) -> bool:
        """Learn mode: whether the allow list (not the inject hosts) would refuse ``host``."""
        policy = self._policy
        return (policy.learn and host not in policy.inject
                and not allowed(policy.allow, host, port))

    def event(self, outcome: Outcome, *, started: float | None = None, up: int | None = None,
              down: int | None = None, target: bytes | None = None) -> None:
        """One line; ``started`` is a ``time.monotonic()`` for the duration.

        ``status`` is written for an allowed request only (the upstream's
        answer); a refusal's own status leads its reason, as in the log line.
        """
        if self._fd is None:
            return
        host, port = outcome.host, outcome.port
        entry: dict[str, object] = {"ev": "egress"}
        if self._tenant is not None:
            entry["tenant"] = self._tenant  # a checked tenant name: [A-Za-z0-9._-], 64 at most
        entry["host"], entry["port"] = _clean(host) or "-", port
        if outcome.mode is not None:
            entry["kind"] = outcome.mode.record_word
        entry["verdict"] = str(outcome.verdict)
        if outcome.text:
            entry["reason"] = _clean(outcome.text)
        if outcome.method is not None:
            entry["method"] = _clean(outcome.method.decode("ascii", "replace"), 16)
        if target is not None:
            entry["path"] = request_path(target)
        if outcome.status is not None and outcome.verdict is Verdict.ALLOWED:
            entry["status"] = outcome.status
        if up is not None:
            entry["up"] = up
        if down is not None:
            entry["down"] = down
        if started is not None:
            entry["dur"] = round(time.monotonic() - started, 4)
        if host != "-" and self.would_refuse(host, port):
            entry["learn"] = LEARN_MARK
        try:
            os.write(self._fd, event_line(entry).encode())
        except OSError as exc:
            # The reader is gone (the launcher died): the proxy ends with it anyway.
            self.failed = exc.strerror or str(exc)

    def request(self, mode: Mode, host: str, port: int, method: bytes, target: bytes,
                moved: Exchanged, started: float) -> None:
        """One HTTP request through the proxy (inject hosts, plain HTTP), allowed."""
        if self._fd is not None:
            outcome = Outcome(Verdict.ALLOWED, host, port, mode=mode,
                              status=moved.status or None, method=method)
            self.event(outcome, started=started, up=moved.up, down=moved.down, target=target)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
