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
  field, or refuses it (its column of :data:`REALISED`; a test holds that
  both say something of each);
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
from typing import Protocol

from libbroker.named_tuple import NamedTuple
from libbroker.sandbox import kinds


class Finding(NamedTuple):
    """What ``agent-sandbox doctor`` says of a backend (its ``Check``'s fields)."""

    level: str  # "ok", "warn" or "FAIL"
    what: str
    fix: str = ""
    group: str = ""
    short: str = ""


OK, WARN, FAIL = "ok", "warn", "FAIL"

REALISED: dict[str, tuple[str, str]] = {
    # Shape field: how bwrap realises it, how Landlock does (or why it cannot), side by side.
    "read": ("read-only binds", "read-only rules"),
    "write": ("read-write binds", "read-write rules"),
    "deny": ("an empty read-only tmpfs (or /dev/null) over it, even inside a grant",
             "no rule under it; refused inside a granted tree (ConfigError)"),
    "protect": ("read-only binds over the writable tree",
                "read-only binds in the session helper's mount namespace, refused without one "
                "(the broker's commands have none to hold: a profile has no protect)"),
    "masked": ("/dev/null bound over each",
               "not realised: /etc is granted whole, so only their modes keep them (a root user "
               "reads them)"),
    "empty": ("a tmpfs over each",
              "not realised: not granted, so unreadable rather than empty (the session gives "
              "HOME a directory of its own)"),
    "devices": ("ignored: bwrap's own /dev holds the same nodes", "read-write rules"),
    "tcp_connect": ("nothing but these ports in its own network namespace, each bridged to the "
                    "host's (bwrap_backend.BwrapStart)",
                    "the only ports connect() may reach"),
    "cwd": ("--chdir", "chdir before it restricts itself"),
    "env": ("the caller's environment for bwrap", "the environment it execs with"),
    "tmp": ("ignored: a fresh /tmp instead",
            "a private directory among the write rules, named by TMPDIR"),
    "tmp_size": ("the size of that /tmp", "ignored: the private tmp is a directory of the host's"),
    "new_session": ("--new-session", "setsid()"),
    "hostname": ("--hostname", "ignored: no UTS namespace"),
    "overlays": ("read-only binds over the path", "ignored: it mounts nothing over a path"),
    "binds": ("read-write binds",
              "binds in the session helper's mount namespace, refused without one (a broker's "
              "profile has none)"),
    "links": ("not needed: the session holds the links (sandbox.holdlink)",
              "made mount points in that namespace (sandbox.holdlink); only with binds"),
}
"""What each backend (in :data:`.kinds.AUTO_ORDER`) makes of each Shape field, side by side."""


class Backend(ABC):
    """One kernel mechanism: its name, its checks, and what it makes of a Shape."""

    name: str  # as users type it (--sandbox=NAME), from :mod:`.kinds`
    executor: str  # broker-server's executor module for it (its EXECUTOR class)

    @property
    def realises(self) -> Mapping[str, str]:
        """How it realises each :class:`~.shape.Shape` field, or refuses it (:data:`REALISED`)."""
        column = kinds.AUTO_ORDER.index(self.name)
        return {field: ways[column] for field, ways in REALISED.items()}

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
