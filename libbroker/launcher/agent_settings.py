"""The agents' settings as a session rewrites them, and Claude Code's undone on the way back.

Pure: each takes the user's settings (a JSON object, or Codex's config.toml
text) and returns the session's; :mod:`.agent_home` reads and writes the
files, and the agents' classes (:mod:`.agents`) say which edit is theirs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def claude_settings(user: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Claude Code settings: the user's, plus our hook and deny rules.

    Claude Code's own sandbox is turned off (we are the sandbox: nested, it
    breaks unix sockets under bwrap and every command under Landlock).
    """
    out = dict(user)
    hooks = {k: list(v) for k, v in dict(out.get("hooks") or {}).items() if isinstance(v, list)}
    for event, groups in dict(session.get("hooks") or {}).items():
        hooks[event] = [*hooks.get(event, []), *groups]
    out["hooks"] = hooks
    perms = dict(out.get("permissions") or {})
    deny = list(perms.get("deny") or [])
    extra = list(dict(session.get("permissions") or {}).get("deny") or [])
    perms["deny"] = deny + [r for r in extra if r not in deny]
    out["permissions"] = perms
    sandbox = dict(out.get("sandbox") or {})
    sandbox["enabled"] = False
    out["sandbox"] = sandbox
    return out


def gemini_settings(user: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Gemini CLI settings: the user's, with its tool sandboxing off."""
    out = dict(user)
    security = dict(out.get("security") or {})
    security["toolSandboxing"] = False
    out["security"] = security
    tools = dict(out.get("tools") or {})
    if "sandbox" in tools:
        tools["sandbox"] = False
    out["tools"] = tools
    return out


def codex_config(toml: str) -> str:
    """The session's Codex config.toml: the user's, with ``sandbox_mode`` pinned at the top.

    Codex started by another command (``--agent=codex -- bash -c 'codex exec
    ...'``) gets no ``-c`` of ours on its command line; this holds for it too.
    A top-level ``sandbox_mode`` of the user's is dropped (a key twice is an
    error in TOML); tables below keep theirs (a profile's; ``-p`` picks it).
    """
    lines = toml.splitlines(keepends=True)
    top = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")), len(lines))
    kept = [ln for ln in lines[:top] if not re.match(r"\s*sandbox_mode\s*=", ln)]
    return 'sandbox_mode = "danger-full-access"\n' + "".join(kept + lines[top:])


def claude_unsettle(settings: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`claude_settings` undone: what the session added is not the user's to keep."""
    out = dict(settings)
    ours = dict(session.get("hooks") or {})
    hooks = {
        event: [g for g in groups if g not in ours.get(event, [])]
        for event, groups in dict(out.get("hooks") or {}).items()
        if isinstance(groups, list)
    }
    out["hooks"] = {k: v for k, v in hooks.items() if v}
    perms = dict(out.get("permissions") or {})
    extra = list(dict(session.get("permissions") or {}).get("deny") or [])
    perms["deny"] = [r for r in perms.get("deny") or [] if r not in extra]
    out["permissions"] = {k: v for k, v in perms.items() if v}
    for key in ("hooks", "permissions"):
        if not out[key]:
            del out[key]
    out.pop("sandbox", None)
    return out
