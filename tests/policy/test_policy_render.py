"""Claude Code settings: the machine-wide drop-in (inert outside sessions) and a session's."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from libpolicy.model import Policy
from libpolicy.render import (
    MATCHER,
    OUTSIDE,
    denied_regions,
    render_json,
    render_settings,
    session_settings,
)

# The keys and types the Claude Code settings reference documents for what we
# render (sandbox.*, hooks.PreToolUse, permissions.deny, env).  A key outside
# this shape, or a value of another type, would be ignored or rejected there.
STRINGS = ("list", str)
SHAPE: dict[str, object] = {
    "sandbox": {
        "enabled": bool,
        "failIfUnavailable": bool,
        "allowUnsandboxedCommands": bool,
        "filesystem": {
            "denyRead": STRINGS, "allowRead": STRINGS, "allowWrite": STRINGS,
            "denyWrite": STRINGS, "allowManagedReadPathsOnly": bool,
        },
        "network": {
            "allowedDomains": STRINGS, "allowManagedDomainsOnly": bool,
            "httpProxyPort": int, "socksProxyPort": int,
        },
    },
    "hooks": {"PreToolUse": ("list", {"matcher": str, "hooks": (
        "list", {"type": str, "command": str, "timeout": int})})},
    "permissions": {"deny": STRINGS},
    "env": ("map", str),
}


def conforms(value: object, shape: object, where: str = "$") -> list[str]:
    """Every place ``value`` leaves the documented ``shape``."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        errors = [f"{where}.{k}: not a documented key" for k in value if k not in shape]
        for key, sub in shape.items():
            if key in value:
                errors += conforms(value[key], sub, f"{where}.{key}")
        return errors
    if isinstance(shape, tuple) and shape[0] == "list":
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [e for i, item in enumerate(value)
                for e in conforms(item, shape[1], f"{where}[{i}]")]
    if isinstance(shape, tuple) and shape[0] == "map":
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        return [e for k, v in value.items() for e in conforms(v, shape[1], f"{where}.{k}")]
    assert isinstance(shape, type)
    if shape is int and isinstance(value, bool):
        return [f"{where}: a boolean, not an integer"]
    return [] if isinstance(value, shape) else [f"{where}: not {shape.__name__}"]


def _absolute(sandbox_path: str) -> str:
    # "//abs" is the absolute form in both the old and new path rules.
    assert sandbox_path.startswith("//"), sandbox_path
    return sandbox_path[1:]


def _command(settings: dict[str, object]) -> str:
    hooks = settings["hooks"]
    assert isinstance(hooks, dict)
    return str(hooks["PreToolUse"][0]["hooks"][0]["command"])


def test_rendered_settings_have_the_documented_shape(world: tuple[Path, Policy],
                                                     policy_file: Path) -> None:
    _, policy = world
    for settings in (json.loads(render_json(policy, str(policy_file))),
                     session_settings(policy, str(policy_file))):
        assert conforms(settings, SHAPE) == []
        group = settings["hooks"]["PreToolUse"][0]
        assert group["matcher"] == MATCHER
        assert group["hooks"][0]["type"] == "command"


def test_the_drop_in_changes_nothing_outside_a_session(world: tuple[Path, Policy],
                                                       policy_file: Path) -> None:
    """Machine-wide: no sandbox switched on, no deny rule, no variable, a gated hook."""
    _, policy = world
    settings = render_settings(policy, str(policy_file))
    assert set(settings) == {"sandbox", "hooks"}
    assert set(settings["sandbox"]) == {"filesystem"}  # enabled is the user's to set
    assert _command(settings).startswith(OUTSIDE)


def test_a_sessions_settings_turn_its_own_sandbox_off(world: tuple[Path, Policy],
                                                      policy_file: Path) -> None:
    _, policy = world
    settings = session_settings(policy, str(policy_file))
    assert settings["sandbox"] == {"enabled": False}
    assert not _command(settings).startswith(OUTSIDE)  # the session's own file: always on
    assert settings["permissions"]["deny"]


def test_matcher_is_exactly_the_file_tools() -> None:
    tools = ["Read", "Grep", "Glob", "Edit", "MultiEdit", "Write", "NotebookEdit"]
    for name in tools:
        assert re.search(MATCHER, name)
    for name in ["TodoWrite", "Bash", "ReadX", "xRead", "WebFetch", "NotebookRead", ""]:
        assert not re.search(MATCHER, name)


def test_rendered_settings_round_trip_the_policy(world: tuple[Path, Policy],
                                                 policy_file: Path) -> None:
    _, policy = world
    settings = render_settings(policy, str(policy_file))
    fs = settings["sandbox"]["filesystem"]
    # Commands, where a user turns Claude Code's sandbox on: never the deny paths,
    # never a write to the harness.
    assert [_absolute(p) for p in fs["denyRead"]] == list(policy.deny)
    assert [_absolute(p) for p in fs["denyWrite"]] == [*policy.deny, policy.harness]
    # The hook reads back exactly this policy, in both renderings.
    for rendered in (settings, session_settings(policy, str(policy_file))):
        option = next(a for a in shlex.split(_command(rendered)) if a.startswith("--policy="))
        assert Policy.load(option.removeprefix("--policy=")) == policy


def test_permission_deny_rules_cover_only_wholly_denied_regions(world: tuple[Path, Policy]) -> None:
    _, policy = world
    rules = session_settings(policy)["permissions"]["deny"]
    deny = policy.deny[0]
    assert f"Read(/{deny})" in rules and f"Read(/{deny}/**)" in rules
    assert f"Edit(/{deny}/**)" in rules
    # Home holds readable paths, so a Read rule on it would deny them too.
    assert not any(r.startswith(f"Read(/{policy.home})") for r in rules)
    # The runtime's egress dir is readable: no rule on the runtime either.
    assert not any(policy.runtime in r for r in rules)
    # tool_write lies inside the harness: no Edit rule on it.
    assert f"Edit(/{policy.harness}/**)" not in rules
    assert all(r.startswith(("Read(//", "Edit(//")) for r in rules)


def test_permission_deny_rules_when_nothing_is_reallowed() -> None:
    policy = Policy("/home/u", runtime="/run/user/1", write=["/srv/work"], harness="/home/u/.c")
    read, edit = denied_regions(policy)
    assert read == ["/home/u", "/run/user/1"]
    assert edit == ["/home/u", "/run/user/1", "/home/u/.c"]
    rules = session_settings(policy)["permissions"]["deny"]
    assert "Read(//home/u/**)" in rules and "Edit(//home/u/.c/**)" in rules


def test_hook_command_is_quoted_and_overridable(tmp_path: Path) -> None:
    policy = Policy("/h", hook="/opt/agent sandbox/policy-hook")
    path = str(tmp_path / "my policy.json")
    command = _command(session_settings(policy, path))
    assert command == ("{ /opt/agent sandbox/policy-hook --policy=" + shlex.quote(path)
                       + "; } || exit 2")
    assert _command(render_settings(policy, path)) == OUTSIDE + command
    plain = Policy("/h")
    command = _command(session_settings(plain))
    assert shlex.split(command)[:3] == [sys.executable, "-I", "-S"]


def test_the_rendered_hook_command_runs_and_denies(world: tuple[Path, Policy],
                                                   policy_file: Path) -> None:
    """The command Claude Code would run (through a shell), end to end."""
    _, policy = world
    command = _command(render_settings(policy, str(policy_file)))
    # In a session, without AGENT_SANDBOX_POLICY: --policy must carry it.
    env = {"PATH": os.environ["PATH"], "AGENT_SANDBOX": "1"}
    event = json.dumps({
        "session_id": "s", "transcript_path": "/t.jsonl", "cwd": policy.write[0],
        "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "Read",
        "tool_input": {"file_path": "to_ssh/id"}, "tool_use_id": "toolu_1"}).encode()
    done = subprocess.run(["sh", "-c", command], input=event, capture_output=True, env=env,
                          cwd="/", timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    decision = json.loads(done.stdout)["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny"
    allowed = event.replace(b"to_ssh/id", b"src/main.py")
    done = subprocess.run(["sh", "-c", command], input=allowed, capture_output=True, env=env,
                          cwd="/", timeout=30, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
