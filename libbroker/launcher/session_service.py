"""A session as a tenant of the resident service's gateway (docs/serve.md).

The session keeps everything of its own that it has without the service: its
runtime directory, its secrets file (host-only), its broker and door, its
record.  What changes is who runs its egress: the service's gateway, where the
session is a tenant with its own credential and policy.  The gateway writes the
tenant's record lines to a FIFO in the session's host-only directory, which
only this launcher reads (into the session record, as it reads its own proxy's
stdout otherwise).
"""

from __future__ import annotations

import collections
import os
import select
from collections.abc import Callable

from libbroker.launcher import plan
from libbroker.launcher.config import Config
from libbroker.launcher.runtime import Runtime
from libbroker.launcher.serve_link import Link, ServiceGone
from libbroker.launcher.trace import trace

RECORD_FIFO = "proxy-record"
LOG_FIFO = "proxy-log"
DRAIN_BOUND = 2.0  # seconds for the gateway to close a removed tenant's record
MAX_ENV_BYTES = 48 * 1024  # the gateway's request line is at most 64 KiB, policy included


def usable(cfg: Config) -> str:
    """Why this session cannot be a tenant of the shared gateway ("" when it can)."""
    if cfg.upstream_ca:
        return "upstream_ca is the whole gateway's, not a session's"
    if cfg.kubeconfig:
        # kubeconfig-proxify would need the credential on its command line.
        return "a kubeconfig session proxies it with its own proxy"
    return ""


def register(link: Link, cfg: Config, rt: Runtime) -> bool:
    """Send the session's tenant to the service; False when the session runs its own proxy.

    Only a service that is not there (the request cannot be sent) or a
    config it cannot serve gives False; the link stays (it holds the
    session's broker).  A refusal in the reply is the session's error
    (:meth:`Link.reply`).
    """
    why = usable(cfg)
    if why:
        trace(f"resident gateway not used: {why}")
        return False
    env = dict(os.environ)
    if sum(len(k) + len(v) + 8 for k, v in env.items()) > MAX_ENV_BYTES:
        # The gateway's control line holds at most 64 KiB: ours would be refused.
        trace("resident gateway not used: the environment is too large for its request")
        return False
    record = ""
    if cfg.record:
        record = os.path.join(rt.host_only, RECORD_FIFO)
        link.open_record(record)
    log = os.path.join(rt.host_only, LOG_FIFO)  # its log lines, as our own proxy's stderr
    link.open_log(log)
    policy = plan.tenant_policy(cfg, rt, record)
    policy["log"] = log
    try:
        # The tenant's token and secret commands run with our environment, as our
        # own proxy's would (printenv VAR, gh auth token); it stays in memory.
        link.send(policy, env)
    except ServiceGone:
        trace("resident service gone before the request: own proxy")
        link.close_record()
        return False
    trace("tenant requested from the resident service")
    return True


class TenantOutput:
    """The gateway's lines for this tenant: its record as a server's stdout, its log as
    a server's stderr."""

    name = "egress-proxy"

    def __init__(self, link: Link) -> None:
        self.link = link
        self.tail: collections.deque[str] = collections.deque(maxlen=20)

    def drain(self, read_lines: Callable[[int], list[str]]) -> None:
        """Read both FIFOs until the gateway closes them (bounded): the tenant's last lines."""
        import time

        fds = [fd for fd in (self.link.record_fd, self.link.log_fd) if fd >= 0]
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + DRAIN_BOUND
        while fds and (left := deadline - time.monotonic()) > 0:
            events = poller.poll(int(left * 1000) + 1)
            if not events:
                break
            for fd, event in events:
                if event & select.POLLIN:
                    read_lines(fd)
                else:  # end of file: the gateway closed it (the tenant was removed)
                    poller.unregister(fd)
                    fds.remove(fd)
