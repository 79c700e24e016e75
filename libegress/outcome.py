"""What became of one connection or request through the proxy: the value the log and record share.

Every path (CONNECT, SOCKS, plain HTTP, an inject host's requests, the
listener's own checks) says what happened as an :class:`Outcome`; the log
line and the ``--record`` line are both written from it, so the two cannot
tell the same event apart in different words.  The HTTP statuses the proxy
answers map to a verdict in one place, :func:`verdict_of`.
"""

from __future__ import annotations

import enum

from libbroker.named_tuple import NamedTuple


class Verdict(enum.StrEnum):
    """The word that opens a log line and fills a record line's ``verdict``."""

    ALLOWED = "allowed"
    REFUSED = "refused"  # the policy (or the request itself) said no
    FAILED = "failed"  # the way there broke: DNS, connect, TLS, a bad upstream
    LIMIT = "limit"  # a bound of the proxy's own: time, head size, connections


class Mode(enum.Enum):
    """How an allowed connection goes: one name, with its word in the log and in the record.

    The two words differ for history's sake (``mode=raw`` in the log is
    ``"kind": "tunnel"`` in the record); both are read by people and tests,
    so both stay, and this is the one table that pairs them.
    """

    TUNNEL = ("raw", "tunnel")  # a CONNECT tunnel, spliced
    SOCKS = ("socks", "socks")  # a SOCKS tunnel, spliced
    INTERCEPT = ("intercept", "injected")  # TLS terminated, the credential set
    PLAIN = ("http", "plain")  # absolute-form plain HTTP

    def __init__(self, log_word: str, record_word: str) -> None:
        self.log_word = log_word
        self.record_word = record_word


# The proxy's own bounds: a request too slow (408) or too large (431), too many
# connections (503: the listener's and a gateway tenant's; an unreachable
# upstream is 502 or 504, never 503).
LIMIT_STATUSES = frozenset({408, 431, 503})


def verdict_of(status: int) -> Verdict:
    """The verdict of a status the proxy answers with instead of the upstream."""
    if status in LIMIT_STATUSES:
        return Verdict.LIMIT
    return Verdict.FAILED if status >= 500 else Verdict.REFUSED


class Outcome(NamedTuple):
    """One event: a verdict for ``host``:``port``, how (``mode``), the status, and why.

    ``status`` is the proxy's answer for a refusal, the upstream's for an
    allowed request; ``method`` is the request's, when one was read.
    """

    verdict: Verdict
    host: str
    port: int
    reason: str = ""
    mode: Mode | None = None
    status: int | None = None
    method: bytes | None = None

    @classmethod
    def answered(cls, status: int, why: str, host: str, port: int,
                 method: bytes | None = None) -> Outcome:
        """The proxy answered ``status`` itself (a refusal, a failure or a limit)."""
        return cls(verdict_of(status), host, port, why, status=status, method=method)

    @property
    def text(self) -> str:
        """The reason as the log line and the record say it: a refusal's status first."""
        if self.status is not None and self.verdict is not Verdict.ALLOWED:
            return f"{self.status} {self.reason}"
        return self.reason
