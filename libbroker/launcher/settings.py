"""``agent-sandbox render-settings``: Claude Code's managed-settings drop-in.

Optional: every session gives Claude Code its own settings (the hook, the
deny rules, its own sandbox off; :mod:`.agent_session`), so nothing needs
installing.  The drop-in (rendered by libpolicy from the same config a
session uses) adds, machine-wide, a hook that acts only inside a session and
a ``sandbox`` block that applies only where a user turns Claude Code's own
sandbox on: installed, it changes nothing for ``claude`` outside sessions
(see :mod:`libpolicy.render`).  The hook finds each session's policy through
``AGENT_SANDBOX_POLICY``.

The JSON goes to stdout (so it can be redirected into place), the
installation steps to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from libbroker.launcher.config import Config

if TYPE_CHECKING:
    from libpolicy.model import Policy


def policy_for(cfg: Config) -> Policy:
    """The config as a libpolicy Policy, with the in-sandbox proxy ports."""
    from libbroker.launcher.plan import session_policy

    base = os.environ.get("XDG_RUNTIME_DIR", "")
    return session_policy(cfg, os.path.join(base, "agent-sandbox") if os.path.isabs(base) else "")


def instructions(target: str) -> str:
    return (
        "# Optional (sessions carry the hook in their own settings). To install this\n"
        "# drop-in (as root), then restart Claude Code:\n"
        f"#   agent-sandbox render-settings > /tmp/agent-sandbox.json\n"
        f"#   sudo install -D -m 0644 /tmp/agent-sandbox.json {target}\n"
        "# Outside sessions it changes nothing: its hook acts only in a session, and\n"
        "# its sandbox block only where you set sandbox.enabled yourself.\n"
        "# agent-sandbox doctor reports whether it is installed and current.\n"
    )


def target_path() -> str:
    from libpolicy.render import DROP_IN, MANAGED_DIR

    return os.path.join(MANAGED_DIR, DROP_IN)


def render(cfg: Config) -> str:
    from libpolicy.render import render_json

    return render_json(policy_for(cfg), None)


def main(cfg: Config) -> int:
    sys.stdout.write(render(cfg))
    sys.stdout.flush()
    sys.stderr.write(instructions(target_path()))
    return 0
