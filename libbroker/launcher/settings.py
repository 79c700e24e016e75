"""``agent-sandbox render-settings``: Claude Code's managed-settings drop-in.

The drop-in is rendered by libpolicy from the same config a session uses, so
Claude Code's own sandbox and hook hold commands and file tools to the lists
the launcher's sandbox enforces.  Session-specific paths are left out: the
hook finds each session's policy through ``AGENT_SANDBOX_POLICY``, and the
launcher sets the proxy and CA variables itself.

The JSON goes to stdout (so it can be redirected into place), the
installation steps to stderr.
"""

from __future__ import annotations

import os
import sys

from libbroker.launcher.agent_sandbox import HTTP_PORT, SOCKS_PORT
from libbroker.launcher.config import Config


def policy_for(cfg: Config) -> object:
    """The config as a libpolicy Policy, with the in-sandbox proxy ports."""
    from libpolicy.model import Policy

    base = os.environ.get("XDG_RUNTIME_DIR", "")
    return Policy(
        cfg.home,
        runtime=os.path.join(base, "agent-sandbox") if os.path.isabs(base) else "",
        read=cfg.read,
        write=(cfg.workdir, *cfg.write),
        deny=cfg.deny,
        harness=cfg.harness,
        domains=cfg.domains,
        proxy_port=HTTP_PORT,
        socks_port=SOCKS_PORT,
    )


def instructions(target: str) -> str:
    return (
        "# Install this drop-in (as root), then restart Claude Code:\n"
        f"#   agent-sandbox render-settings > /tmp/agent-sandbox.json\n"
        f"#   sudo install -D -m 0644 /tmp/agent-sandbox.json {target}\n"
        "# agent-sandbox doctor reports whether it is installed and current.\n"
    )


def target_path() -> str:
    from libpolicy.render import DROP_IN, MANAGED_DIR

    return os.path.join(MANAGED_DIR, DROP_IN)


def render(cfg: Config) -> str:
    from libpolicy.model import Policy
    from libpolicy.render import render_json

    policy = policy_for(cfg)
    assert isinstance(policy, Policy)
    return render_json(policy, None)


def main(cfg: Config) -> int:
    sys.stdout.write(render(cfg))
    sys.stdout.flush()
    sys.stderr.write(instructions(target_path()))
    return 0
