"""What every connection handler shares: the policy, limits, CA, token, log."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from libegress.addresses import IPAddress
from libegress.ca import LeafCache
from libegress.eventlog import EventLog
from libegress.http1 import Limits
from libegress.peers import pid_of_inode
from libegress.policy import EgressPolicy
from libegress.tokens import TokenKeeper


@dataclass
class Services:
    """The proxy's shared, long-lived parts."""

    policy: EgressPolicy
    limits: Limits
    leaves: LeafCache
    tokens: TokenKeeper
    upstream_tls: ssl.SSLContext
    log: EventLog


@dataclass
class Peer:
    """A client connection's far end; its pid is looked up for log lines only."""

    address: IPAddress
    port: int
    inode: int | None = None
    _pid: int | None = field(default=None, repr=False)
    _looked: bool = field(default=False, repr=False)

    def pid(self) -> int | None:
        if not self._looked and self.inode is not None:
            self._pid = pid_of_inode(self.inode)
            self._looked = True
        return self._pid


def upstream_context(cafile: str | None) -> ssl.SSLContext:
    """Verifying TLS client context: system roots, or ``--upstream-ca`` only."""
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
