"""The Backend protocol: one object per kernel mechanism, asked alike by broker and session.

What differs between bwrap and Landlock is asked of a :class:`Backend`,
found by name in :mod:`.backends` (``auto`` chosen there, once), never by
testing the name: nothing outside ``sandbox/`` knows which mechanism it has.

- :meth:`Backend.unavailable`: why it cannot run here, cheaply, before a
  session starts anything;
- :meth:`Backend.diagnose`: ``agent-sandbox doctor``'s finding for it;
- :attr:`Backend.executor`: the module of broker-server's executor for it,
  imported only when chosen (named, not imported: ``sandbox/`` imports
  nothing above it);
- :attr:`Backend.realises`: how it realises each :class:`~.shape.Shape`
  field, or refuses it (a test holds that both say something of each);
- the sandbox's life, the same for both of its callers (broker-server's
  executor and the session's box), each backend's own start object:
  :class:`.bwrap_backend.BwrapStart` (its pipes, the proxy's ports inside,
  go, signals, release) and :class:`.landlock_backend.ReaperLine` (signals
  to the command's reaper, end of file its end).  They start the command
  differently (the broker forks itself under Landlock, the session starts a
  helper) and keep those steps their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, NamedTuple, Protocol

from libbroker.sandbox import kinds


class Finding(NamedTuple):
    """What ``agent-sandbox doctor`` says of a backend (its ``Check``'s fields)."""

    level: str  # "ok", "warn" or "FAIL"
    what: str
    fix: str = ""
    group: str = ""
    short: str = ""


OK, WARN, FAIL = "ok", "warn", "FAIL"


class Backend(ABC):
    """One kernel mechanism: its name, its checks, and what it makes of a Shape."""

    name: str  # as users type it (--sandbox=NAME), from :mod:`.kinds`
    executor: str  # broker-server's executor module for it (its EXECUTOR class)
    realises: ClassVar[Mapping[str, str]]  # Shape field -> how it realises (or refuses) it

    @property
    def denies_inside_grants(self) -> bool:
        """Whether it can hide a path inside a tree it grants (:mod:`.kinds` says)."""
        return kinds.denies_inside_grants(self.name)

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why this backend cannot run here, found cheaply (no sandbox is made); else None."""

    @abstractmethod
    def diagnose(self) -> Finding:
        """Whether it works here, trying it; the fix when not."""


class Started(Protocol):
    """A started sandbox as its caller holds it, whatever the backend: the command's
    signals, and the release of what its start holds (each idempotent)."""

    def signal(self, sig: int) -> bool:
        """``sig`` for the command; False when the line to it is closed (nothing sent)."""

    def release(self) -> None:
        """Everything the start holds, closed."""
