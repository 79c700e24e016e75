"""Claude Code's PreToolUse hook: hold the file tools to the policy.

:func:`evaluate` is the pure core: the hook input's bytes and a policy in, the
deny document (or None) out.  :func:`run_hook` is the thin shell the console
script calls: it loads the policy, makes the hook's own cwd the session's (so
``/proc/self/cwd`` resolves as it would in the harness) and maps every failure
to exit 2, the one status that blocks the call: exit 1 would let it proceed.

Never prints "allow": an allowed call gets no output, so the harness's normal
permission flow stays in force.  Imports json, os and the policy modules only:
this runs on every file-tool call.
"""

from __future__ import annotations

import json
import os

from libbroker.errors import AgentSandboxError, HookInputError
from libpolicy.decide import Decision, readable, search_root_readable, writable
from libpolicy.model import Policy
from libpolicy.paths import clean
from libpolicy.tools import FILE_TOOLS, PatternRefused, touched

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections costs ms at a -S start-up; annotations only
    from collections.abc import Mapping

POLICY_ENV = "AGENT_SANDBOX_POLICY"
_LISTED = 6


def deny_document(reason: str) -> str:
    """The exact PreToolUse deny output of DESIGN 2.3."""
    return json.dumps(
        {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        },
        separators=(",", ":"),
    )


def _listing(paths: tuple[str, ...]) -> str:
    if not paths:
        return "(none)"
    shown = ", ".join(paths[:_LISTED])
    more = len(paths) - _LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _instead(policy: Policy, access: str) -> str:
    """What the agent may do instead, for the denial's reason."""
    hidden = " and ".join(p for p in (policy.home, policy.runtime) if p)
    readable_list = _listing((*policy.write, *policy.tool_write, *policy.read))
    if access == "write":
        writable_list = _listing((*policy.write, *policy.tool_write))
        return (f"The file tools may write only under: {writable_list}"
                " (never under the deny paths). Write inside those paths instead, or ask the "
                "person to widen the agent-sandbox policy.")
    base = f"The file tools may read anything outside {hidden}, and under: {readable_list}"
    if access == "search":
        return (base + ". Search a narrower path instead, one inside those (for example a "
                "subdirectory of the working directory), never an ancestor of a denied one.")
    return base + ". Read inside those paths instead, or ask the person to widen the policy."


def check_call(policy: Policy, tool: str, tool_input: dict[str, object], cwd: str) -> str | None:
    """The denial reason for one file-tool call, or None when every path it touches is allowed."""
    try:
        touches = touched(tool, tool_input)
    except PatternRefused as exc:
        return (f"{tool} denied by the agent-sandbox policy: {exc}. "
                "Name the directory in the path field instead.")
    for access, path in touches:
        decision: Decision
        if access == "read":
            decision = readable(policy, path, cwd)
        elif access == "write":
            decision = writable(policy, path, cwd)
        else:
            decision = search_root_readable(policy, path, cwd)
        ok, why = decision
        if not ok:
            verb = {"read": "reading", "write": "writing", "search": "searching"}[access]
            return (f"{tool} denied by the agent-sandbox policy: {verb} {path!r}: {why}. "
                    + _instead(policy, access))
    return None


def parse_input(data: bytes) -> tuple[str, dict[str, object], str] | None:
    """``(tool_name, tool_input, cwd)`` of a file-tool call, None for any other tool.

    Raises :class:`HookInputError` for input the hook cannot judge.
    """
    try:
        event = json.loads(data)
    except RecursionError:
        raise HookInputError("hook input nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise HookInputError(f"hook input is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise HookInputError("hook input is not a JSON object")
    name = event.get("hook_event_name", "PreToolUse")
    if name != "PreToolUse":
        raise HookInputError(f"hook input is a {name!r} event, not PreToolUse")
    tool = event.get("tool_name")
    if not isinstance(tool, str):
        raise HookInputError("hook input has no tool_name string")
    if tool not in FILE_TOOLS:
        return None
    tool_input = event.get("tool_input")
    if not isinstance(tool_input, dict):
        raise HookInputError(f"{tool} call without a tool_input object")
    cwd = event.get("cwd")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd:
        raise HookInputError("hook input has no absolute cwd")
    return tool, tool_input, clean(cwd)


def evaluate(policy: Policy, data: bytes) -> str | None:
    """The hook's stdout for the input ``data``: a deny document, or None (no output)."""
    call = parse_input(data)
    if call is None:
        return None
    reason = check_call(policy, *call)
    return None if reason is None else deny_document(reason)


def policy_path(option: str | None, environ: Mapping[str, str]) -> str:
    """The policy file: ``--policy``, else ``$AGENT_SANDBOX_POLICY``."""
    path = option or environ.get(POLICY_ENV, "")
    if not path:
        raise HookInputError(f"no policy: pass --policy=FILE or set {POLICY_ENV}")
    return path


def run_hook(option: str | None, data: bytes) -> tuple[int, str, str]:
    """Hook mode end to end: ``(exit status, stdout, stderr)``; every failure is exit 2."""
    try:
        policy = Policy.load(policy_path(option, os.environ))
        call = parse_input(data)
        if call is None:
            return 0, "", ""
        try:  # noqa: SIM105 - contextlib costs ms at a -S start-up
            # Resolve /proc/self/cwd (and relative symlink chains through it)
            # from where the harness stands.
            os.chdir(call[2])
        except OSError:
            pass
        reason = check_call(policy, *call)
    except AgentSandboxError as exc:
        return 2, "", f"policy-hook: {exc}\n"
    except Exception as exc:  # exit 2 blocks the call; any other status would not
        return 2, "", f"policy-hook: internal error: {type(exc).__name__}: {exc}\n"
    return 0, ("" if reason is None else deny_document(reason) + "\n"), ""
