"""What every connection handler shares: the policy, limits, CA, token, secrets, log."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from libegress.addresses import IPAddress
from libegress.ca import LeafCache
from libegress.eventlog import EventLog
from libegress.limits import Limits
from libegress.peers import PidFinder
from libegress.record import Recorder
from libegress.route import EgressPolicy
from libegress.tokens import SecretKeeper, TokenKeeper, distinct

if TYPE_CHECKING:
    from libegress.gateway import Gate
    from libegress.scope import Scope  # loaded with --repos only (libegress.serving)

# Plain classes, not dataclasses: the proxy makes them after `listening`, while
# the session's command starts, and a dataclass costs ~0.5 ms of CPU at its
# creation (exec of its generated methods) for what these few lines say.


class Services:
    """The proxy's shared, long-lived parts."""

    def __init__(self, policy: EgressPolicy, limits: Limits, leaves: LeafCache,
                 tokens: TokenKeeper, log: EventLog, *, upstream_ca: str | None = None,
                 secrets: dict[str, SecretKeeper] | None = None, pids: PidFinder | None = None,
                 scope: Scope | None = None, record: Recorder | None = None,
                 gate: Gate | None = None, upstream_tls: ssl.SSLContext | None = None) -> None:
        self.policy = policy
        self.limits = limits
        self.leaves = leaves
        self.tokens = tokens
        self.log = log
        self.upstream_ca = upstream_ca  # --upstream-ca, else the system's roots
        self.secrets: dict[str, SecretKeeper] = secrets if secrets is not None else {}  # by host
        self.pids = pids if pids is not None else PidFinder()
        self.scope = scope  # --repos: the token's writes held to those repositories
        # --record (off: a recorder that writes nothing)
        self.record = record if record is not None else Recorder(None, EgressPolicy())
        self.gate = gate  # --control: connections are served by their tenant's services
        self._upstream_tls = upstream_tls

    def keepers(self) -> list[TokenKeeper]:
        """Every runner, once: the GitHub token's and the secrets' (shared by same commands)."""
        return distinct([self.tokens, *(s.keeper for s in self.secrets.values())])

    @property
    def upstream_tls(self) -> ssl.SSLContext:
        """The verifying client context for inject hosts' upstreams, made on first use.

        Loading the system's roots is start-up time the proxy need not pay
        before it listens: many sessions never reach an inject host.
        """
        if self._upstream_tls is None:
            self.load_upstream_tls()
        assert self._upstream_tls is not None
        return self._upstream_tls

    def load_upstream_tls(self) -> None:
        """Make the upstream context now (a bad ``upstream_ca`` file raises here)."""
        self._upstream_tls = upstream_context(self.upstream_ca)


class Peer:
    """A client connection's far end; its pid is looked up for log lines only."""

    __slots__ = ("_pid", "address", "finder", "inode", "port")

    def __init__(self, address: IPAddress, port: int, inode: int | None = None,
                 finder: PidFinder | None = None) -> None:
        self.address = address
        self.port = port
        self.inode = inode
        self.finder = finder
        self._pid: int | None = None

    def pid(self) -> int | None:
        if self._pid is None and self.inode is not None and self.finder is not None:
            self._pid = self.finder.pid(self.inode)
        return self._pid


def upstream_context(cafile: str | None) -> ssl.SSLContext:
    """Verifying TLS client context: system roots, or ``--upstream-ca`` only."""
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
