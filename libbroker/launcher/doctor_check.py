"""One finding of ``agent-sandbox doctor``: its level, what was found, the fix.

Shared by :mod:`.doctor` and the checks kept beside it (:mod:`.doctor_agents`).
"""

from __future__ import annotations

from libbroker.named_tuple import NamedTuple
from libbroker.sandbox.backend import FAIL, OK, WARN  # the levels a backend's finding has too

__all__ = ["FAIL", "OK", "TABLE", "WARN", "Check"]
TABLE = "table"  # a Check.group: listed with --verbose only


class Check(NamedTuple):
    """One finding: a level, what was found, and the fix when not ok.

    ``group``: the kind, whose ok findings share a line by default as
    ``{group}: {short}, {short}, ...``; ``TABLE`` findings show only with --verbose.
    """

    level: str
    what: str
    fix: str = ""
    group: str = ""
    short: str = ""

    def line(self) -> str:
        text = f"{self.level:<4} {self.what}"
        return text + (f" -- fix: {self.fix}" if self.fix and self.level != OK else "")
