"""doctor's agent checks: each known agent's CLI and config, and Claude Code's managed settings.

A missing config is a warning with the command that makes it (run as shown
by tests/launcher/test_doctor_fixes.py); see :mod:`.doctor` for the rest.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from libbroker.launcher.config import Config
from libbroker.launcher.doctor_check import OK, WARN, Check

if TYPE_CHECKING:
    from libbroker.launcher.agents import Profile


def check_agents(cfg: Config) -> list[Check]:
    """One line per installed agent: profile, config dir, hosts allowed, its sandbox mode."""
    from libbroker.launcher import agents

    out = []
    extra = dict(cfg.agents)
    for profile in (*agents.PROFILES.values(), *extra.values()):
        exe = next((c for c in profile.commands if shutil.which(c)), None)
        if exe is None:
            continue
        what = f"agent {profile.name} ({shutil.which(exe)}): profile found"
        missing = [e.host for e in profile.entries if not os.path.exists(cfg.home + e.host[1:])]
        hosts = [d for d in profile.domains if d not in cfg.domains]
        note = f"; {profile.sandbox_note}" if profile.sandbox_note else ""
        if missing:
            out.append(
                Check(
                    WARN,
                    f"{what}; {', '.join(missing)} missing: a session's login and history "
                    f"start empty",
                    f"run {exe} once on the host and log in, or start empty: "
                    f"`{_make_config(profile, missing)}`",
                )
            )
            continue
        added = f"; its hosts are added per session ({', '.join(hosts)})" if hosts else ""
        out.append(Check(OK, f"{what}; config present (a private copy per session){added}{note}",
                         group="agents ready", short=profile.name))
        if profile.reads_managed_settings():
            out.append(check_claude_managed(cfg))
    return out


def _make_config(profile: Profile, missing: list[str]) -> str:
    """The shell command that makes an agent's missing config: its dirs, and files as JSON.

    A file entry (``~/.claude.json``) gets ``{}``, which the agent reads as a
    config with nothing in it; ``mkdir`` there would make a directory where
    the agent wants a file.
    """
    from libbroker.shellquote import quote

    def home(path: str) -> str:  # ~ stays outside the quotes: the shell expands it
        return "~/" + quote(path.removeprefix("~/"))

    steps = []
    for entry in profile.entries:
        if entry.host not in missing:
            continue
        if entry.is_dir:
            steps.append(f"mkdir -p {home(entry.host)}")
            continue
        parent = os.path.dirname(entry.host)
        if parent != "~":
            steps.append(f"mkdir -p {home(parent)}")
        steps.append(f"printf '{{}}\\n' > {home(entry.host)}")
    return " && ".join(steps)


def check_claude_managed(cfg: Config) -> Check:
    """The machine-wide drop-in, if any: one from an older release breaks sessions or host runs."""
    import json

    from libbroker.launcher import settings
    from libpolicy.render import OUTSIDE

    target = settings.target_path()
    from libbroker.shellquote import quote

    fix = (f"`agent-sandbox render-settings | sudo install -D -m 0644 /dev/stdin {quote(target)}`"
           f" (or remove it: `sudo rm {quote(target)}`)")
    try:
        with open(target) as fh:
            text = fh.read()
        data = json.loads(text)
    except (OSError, ValueError):
        return Check(
            OK, "agent claude: no managed-settings drop-in (optional: sessions carry the hook)",
            group="agents ready", short="no drop-in (optional)",
        )
    sandbox = data.get("sandbox") if isinstance(data, dict) else None
    if isinstance(sandbox, dict) and sandbox.get("enabled"):
        return Check(
            WARN,
            f"agent claude: {target} turns Claude Code's own sandbox on: inside a Landlock "
            "session every command fails (bwrap sessions mount their own settings over it)",
            fix,
        )
    hooks = data.get("hooks") if isinstance(data, dict) else None
    groups = hooks.get("PreToolUse") if isinstance(hooks, dict) else None
    commands = [
        str(h.get("command", ""))
        for g in (groups if isinstance(groups, list) else [])
        if isinstance(g, dict)
        for h in (g.get("hooks") or [])
        if isinstance(h, dict)
    ]
    if any("policy_hook" in c or "policy-hook" in c for c in commands) and not all(
        c.startswith(OUTSIDE) for c in commands
    ):
        return Check(
            WARN,
            f"agent claude: {target}'s hook also runs outside sessions, where it blocks "
            "every file tool (no policy)",
            fix,
        )
    if text.strip() != settings.render(cfg).strip():
        return Check(WARN, f"agent claude: {target} differs from this config", fix)
    return Check(
        OK, f"agent claude: {target} installed and current (acts only inside sessions)",
        group="agents ready", short="claude's drop-in current",
    )
