"""Render a policy as Claude Code's managed-settings drop-in.

The drop-in (``/etc/claude-code/managed-settings.d/agent-sandbox.json``) holds
the policy where the harness enforces it: the ``sandbox`` block the sandbox
runtime applies to every command, the PreToolUse hook that holds the file tools
to the same lists, ``permissions.deny`` rules as a second line for the regions
denied outright, and ``env``.  Keys follow the Claude Code settings reference
(sandbox.*, hooks, permissions, env).

Two deliberate choices:

- Sandbox filesystem paths are written ``//abs``: current releases read both
  ``/abs`` and ``//abs`` as absolute, but releases before the fix for
  anthropics/claude-code#30067 read ``/abs`` relative to the settings file, which
  would silently point a denyRead at a path that does not exist.
- Commands never write the harness directory or the tool_write paths: the
  harness goes into denyWrite and tool_write into nothing (only the hook lets the
  file tools write there), so no command can plant a file the harness reads.
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


def hook_command(policy: Policy, policy_file: str | None) -> str:
    """The shell command Claude Code runs for every file-tool call.

    It fails closed: Claude Code blocks a call only on exit 2, and treats any
    other failure (1 from an interpreter that cannot import us, 127 from one
    that is gone, 128+N from a signal) as a non-blocking error that lets the
    call through.  The hook itself exits only 0 or 2, so the shell turns every
    other status into 2.
    """
    command = policy.hook or default_hook()
    if policy_file:
        command += " --policy=" + shlex.quote(policy_file)
    if policy.hook:  # the user's command may be a list: guard all of it
        return "{ " + command + "; } || exit 2"
    return command + " || exit 2"


def ca_env(egress: str) -> dict[str, str]:
    """The variables that make clients trust the egress proxy's CA (files in ``egress``)."""
    bundle = os.path.join(egress, "bundle.pem")
    return {
        "SSL_CERT_FILE": bundle,
        "GIT_SSL_CAINFO": bundle,
        "REQUESTS_CA_BUNDLE": bundle,
        "CURL_CA_BUNDLE": bundle,
        "NODE_EXTRA_CA_CERTS": os.path.join(egress, "ca.pem"),
        "GH_CONFIG_DIR": os.path.join(egress, "gh"),
    }


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


def render_settings(policy: Policy, policy_file: str | None = None) -> dict[str, Any]:
    """The managed-settings drop-in for ``policy``; the hook reads ``policy_file``."""
    network: dict[str, object] = {
        "allowedDomains": list(policy.domains),
        "allowManagedDomainsOnly": True,
    }
    if policy.proxy_port is not None:
        network["httpProxyPort"] = policy.proxy_port
    if policy.socks_port is not None:
        network["socksProxyPort"] = policy.socks_port
    deny_read = [p for p in (policy.home, policy.runtime) if p] + list(policy.deny)
    deny_write = list(policy.deny) + ([policy.harness] if policy.harness else [])
    env: dict[str, str] = {"AGENT_SANDBOX": "1"}
    if policy_file:
        env["AGENT_SANDBOX_POLICY"] = policy_file
    if policy.egress:
        env.update(ca_env(policy.egress))
    env.update(policy.env)
    read_regions, edit_regions = denied_regions(policy)
    return {
        "sandbox": {
            "enabled": True,
            "failIfUnavailable": True,
            "allowUnsandboxedCommands": False,
            "filesystem": {
                "denyRead": [_fs(p) for p in deny_read],
                "allowRead": [_fs(p) for p in (*policy.read, *policy.write, *policy.tool_write)],
                "allowWrite": [_fs(p) for p in policy.write],
                "denyWrite": [_fs(p) for p in deny_write],
                "allowManagedReadPathsOnly": True,
            },
            "network": network,
        },
        "hooks": {
            "PreToolUse": [
                {
                    "matcher": MATCHER,
                    "hooks": [
                        {
                            "type": "command",
                            "command": hook_command(policy, policy_file),
                            "timeout": HOOK_TIMEOUT,
                        }
                    ],
                }
            ]
        },
        "permissions": {"deny": _rules("Read", read_regions) + _rules("Edit", edit_regions)},
        "env": env,
    }


def render_json(policy: Policy, policy_file: str | None = None) -> str:
    """:func:`render_settings` as the drop-in file's text."""
    return json.dumps(render_settings(policy, policy_file), indent=2) + "\n"
