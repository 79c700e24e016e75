"""Render a policy as Claude Code settings: the machine-wide drop-in, and a session's.

Two renderings of one policy:

- :func:`render_settings`: the managed-settings drop-in
  (``/etc/claude-code/managed-settings.d/agent-sandbox.json``), which is
  machine-wide: every ``claude`` reads it, in a session or not.  So it changes
  nothing outside a session.  Its ``sandbox`` block holds only the ``deny``
  paths (never read or written by commands) and the harness directory (never
  written by commands), and sets no ``enabled``: Claude Code's own sandbox stays
  as the user's settings say (off by default), and the block applies only where
  a user turns it on.  Its PreToolUse hook acts only inside a session: where
  neither ``AGENT_SANDBOX`` nor ``AGENT_SANDBOX_POLICY`` is set it exits 0 before
  starting Python (the normal permission flow).  No ``permissions`` and no
  ``env``: those would hold every ``claude`` on the machine.
- :func:`session_settings`: what Claude Code gets inside a session (its
  private config's ``settings.json`` on both backends, and under bwrap a
  session-only managed file mounted over the drop-in's path): Claude Code's
  own sandbox off (we are the sandbox: nested, it breaks unix sockets under
  bwrap and every command under Landlock), the hook without the session test,
  and ``permissions.deny`` rules as a second line for the regions denied
  outright.

Keys follow the Claude Code settings reference (sandbox.*, hooks, permissions).
Sandbox filesystem paths are written ``//abs``: current releases read both
``/abs`` and ``//abs`` as absolute, but releases before the fix for
anthropics/claude-code#30067 read ``/abs`` relative to the settings file, which
would silently point a denyRead at a path that does not exist.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

from libbroker.paths import under
from libpolicy.model import Policy
from libpolicy.tools import FILE_TOOLS

MANAGED_DIR = "/etc/claude-code/managed-settings.d"
DROP_IN = "agent-sandbox.json"
# Anchored, so it is exact under both the old (regex) and new (exact list)
# matcher rules; an unanchored "Write" would also match "TodoWrite".
MATCHER = "^(" + "|".join(FILE_TOOLS) + ")$"
HOOK_TIMEOUT = 30
# Set (to anything, even empty) in every session's environment.  A settings
# file's ``env`` can set a variable but never unset one, so a session cannot
# make the drop-in's hook think it runs outside.
SESSION_VARS = ("AGENT_SANDBOX", "AGENT_SANDBOX_POLICY")
OUTSIDE = '[ -z "${AGENT_SANDBOX+x}${AGENT_SANDBOX_POLICY+x}" ] && exit 0; '


def _fs(path: str) -> str:
    return "/" + path


def default_hook() -> str:
    """policy-hook as a command that starts without site-packages.

    Claude Code runs the hook on every file-tool call, so start-up is most of
    its cost, and the console script pays for ``site`` and every ``.pth`` file
    of the environment.  The hook needs only the standard library and this
    project, so it runs as ``python -I -S`` with the project's root as its one
    addition to ``sys.path`` (isolated mode also keeps PYTHON* variables out).
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (  # a JSON string is a valid Python string literal
        # A checkout that moved or a broken install: one line, not a traceback
        # (the status is made 2 by hook_command's shell guard).
        "import sys; sys.excepthook = lambda t, v, b: sys.stderr.write("
        "'policy-hook cannot start: ' + t.__name__ + ': ' + str(v) + chr(10)); "
        f"sys.path.insert(0, {json.dumps(root)}); "
        "from bin.policy_hook import main; main()"
    )
    return f"{shlex.quote(sys.executable)} -I -S -c {shlex.quote(code)}"


def hook_command(policy: Policy, policy_file: str | None, *, session_only: bool = True) -> str:
    """The shell command Claude Code runs for every file-tool call.

    ``session_only`` (the machine-wide drop-in): outside a session (no
    :data:`SESSION_VARS` set) it exits 0 at once, without starting Python.
    Inside one, and always without ``session_only``, it fails closed: Claude
    Code blocks a call only on exit 2, and treats any other failure (1 from an
    interpreter that cannot import us, 127 from one that is gone, 128+N from a
    signal) as a non-blocking error that lets the call through.  The hook
    itself exits only 0 or 2, so the shell turns every other status into 2.
    """
    command = policy.hook or default_hook()
    if policy_file:
        command += " --policy=" + shlex.quote(policy_file)
    if policy.hook:  # the user's command may be a list: guard all of it
        command = "{ " + command + "; } || exit 2"
    else:
        command += " || exit 2"
    return (OUTSIDE if session_only else "") + command


def denied_regions(policy: Policy) -> tuple[list[str], list[str]]:
    """``(read, edit)``: the regions denied outright, for ``permissions.deny``.

    Home and runtime are listed only when nothing beneath them is allowed: a
    permission deny rule cannot be re-allowed, so listing a home with a read
    path inside would deny that path too.  The hook covers the rest.
    """
    allowed = (*policy.read, *policy.write, *policy.tool_write)
    read = list(policy.deny)
    for region in (policy.home, policy.runtime):
        if region and not any(under(a, region) or under(region, a) for a in allowed):
            read.append(region)
    edit = list(read)
    if policy.harness and not any(under(t, policy.harness) for t in policy.tool_write):
        edit.append(policy.harness)
    return read, edit


def _rules(tool: str, regions: list[str]) -> list[str]:
    out = []
    for region in regions:
        if region == "/":
            out.append(f"{tool}(//**)")
        else:
            # The region itself (a denied file) and everything beneath it.
            out += [f"{tool}({_fs(region)})", f"{tool}({_fs(region)}/**)"]
    return out


def _pre_tool_use(command: str) -> dict[str, Any]:
    return {
        "PreToolUse": [
            {
                "matcher": MATCHER,
                "hooks": [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}],
            }
        ]
    }


def render_settings(policy: Policy, policy_file: str | None = None) -> dict[str, Any]:
    """The machine-wide managed-settings drop-in for ``policy`` (see the module doc).

    The hook reads ``policy_file``, else the session's ``$AGENT_SANDBOX_POLICY``.
    """
    filesystem: dict[str, list[str]] = {}
    if policy.deny:
        filesystem["denyRead"] = [_fs(p) for p in policy.deny]
    deny_write = [*policy.deny, *([policy.harness] if policy.harness else [])]
    if deny_write:
        filesystem["denyWrite"] = [_fs(p) for p in deny_write]
    return {
        "sandbox": {"filesystem": filesystem},
        "hooks": _pre_tool_use(hook_command(policy, policy_file, session_only=True)),
    }


def session_settings(policy: Policy, policy_file: str | None = None) -> dict[str, Any]:
    """What Claude Code gets inside a session: its sandbox off, the hook, the deny rules."""
    read_regions, edit_regions = denied_regions(policy)
    return {
        "sandbox": {"enabled": False},
        "hooks": _pre_tool_use(hook_command(policy, policy_file, session_only=False)),
        "permissions": {"deny": _rules("Read", read_regions) + _rules("Edit", edit_regions)},
    }


def render_json(policy: Policy, policy_file: str | None = None) -> str:
    """:func:`render_settings` as the drop-in file's text."""
    return json.dumps(render_settings(policy, policy_file), indent=2) + "\n"
