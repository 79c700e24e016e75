"""What every connection handler shares: the policy, limits, CA, token, secrets, log."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libegress.addresses import IPAddress
from libegress.ca import LeafCache
from libegress.eventlog import EventLog
from libegress.limits import Limits
from libegress.peers import PidFinder
from libegress.record import Recorder
from libegress.route import EgressPolicy
from libegress.scope import Scope
from libegress.tokens import SecretKeeper, TokenKeeper, distinct

if TYPE_CHECKING:
    from libegress.gateway import Gate


@dataclass
class Services:
    """The proxy's shared, long-lived parts."""

    policy: EgressPolicy
    limits: Limits
    leaves: LeafCache
    tokens: TokenKeeper
    log: EventLog
    upstream_ca: str | None = None  # --upstream-ca, else the system's roots
    secrets: dict[str, SecretKeeper] = field(default_factory=dict)  # by host
    pids: PidFinder = field(default_factory=PidFinder)
    scope: Scope | None = None  # --repos: the token's writes held to those repositories
    record: Recorder = field(default_factory=lambda: Recorder(None, EgressPolicy()))  # --record
    gate: Gate | None = None  # --control: connections are served by their tenant's services
    _upstream_tls: ssl.SSLContext | None = field(default=None, repr=False)

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


@dataclass
class Peer:
    """A client connection's far end; its pid is looked up for log lines only."""

    address: IPAddress
    port: int
    inode: int | None = None
    finder: PidFinder | None = field(default=None, repr=False)
    _pid: int | None = field(default=None, repr=False)

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
