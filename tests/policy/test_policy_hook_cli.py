"""The real policy-hook console script, fed the JSON Claude Code sends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libpolicy.hook import run_hook
from libpolicy.model import Policy

DENY_PREFIX = ('{"hookSpecificOutput":{"hookEventName":"PreToolUse",'
               '"permissionDecision":"deny","permissionDecisionReason":')


def event(tool: str, tool_input: dict[str, object], cwd: str) -> bytes:
    """A PreToolUse input exactly as Claude Code sends it."""
    return json.dumps({
        "session_id": "abc123",
        "transcript_path": "/root/.claude/projects/x/abc123.jsonl",
        "cwd": cwd,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_01ABC",
    }).encode()


def hook_exe() -> str:
    """The real policy-hook console script (the one beside this interpreter, not a shim)."""
    beside = os.path.join(os.path.dirname(sys.executable), "policy-hook")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("policy-hook")
    if found is None:
        pytest.skip("policy-hook is not installed (pip install -e .)")
    return found


def hook(args: list[str], stdin: bytes, env: dict[str, str] | None = None,
         cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """Run the real policy-hook; the policy variable only when ``env`` sets it."""
    full_env = {k: v for k, v in os.environ.items() if k != "AGENT_SANDBOX_POLICY"}
    full_env.update(env or {})
    done = subprocess.run([hook_exe(), *args], input=stdin, capture_output=True, env=full_env,
                          cwd=cwd, timeout=30, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode("utf-8", "replace"),
                                       done.stderr.decode("utf-8", "replace"))


def assert_denied(done: subprocess.CompletedProcess[str], fragment: str = "") -> str:
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(DENY_PREFIX), done.stdout
    doc = json.loads(done.stdout)
    assert list(doc) == ["hookSpecificOutput"]
    out = doc["hookSpecificOutput"]
    assert set(out) == {"hookEventName", "permissionDecision", "permissionDecisionReason"}
    assert out["permissionDecision"] == "deny"
    reason: str = out["permissionDecisionReason"]
    assert fragment in reason
    assert "instead" in reason
    assert "Traceback" not in done.stderr
    return reason


def assert_silent(done: subprocess.CompletedProcess[str]) -> None:
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_allowed_read_prints_nothing(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    proj = policy.write[0]
    assert_silent(hook([f"--policy={policy_file}"],
                       event("Read", {"file_path": f"{proj}/src/main.py"}, proj)))


def test_denied_read_of_a_home_secret(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    reason = assert_denied(hook([f"--policy={policy_file}"],
                                event("Read", {"file_path": f"{policy.home}/.ssh/id"},
                                      policy.write[0])), "under home")
    assert policy.write[0] in reason  # tells the agent where it may read instead


def test_relative_path_is_taken_from_the_input_cwd(world: tuple[Path, Policy],
                                                   policy_file: Path) -> None:
    _, policy = world
    proj = policy.write[0]
    # The hook itself runs in /; the input's cwd decides.
    assert_denied(hook(["--policy", str(policy_file)],
                       event("Read", {"file_path": "../.ssh/id"}, proj)))
    assert_silent(hook(["--policy", str(policy_file)],
                       event("Read", {"file_path": "src/main.py"}, proj)))


def test_proc_self_cwd_is_the_sessions_cwd(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    # Started inside the workdir, but the session stands in home.
    assert_denied(hook([f"--policy={policy_file}"],
                       event("Read", {"file_path": "/proc/self/cwd/.ssh/id"}, policy.home),
                       cwd=policy.write[0]))


def test_symlink_into_home_is_denied(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    assert_denied(hook([f"--policy={policy_file}"],
                       event("Edit", {"file_path": "to_ssh/authorized_keys", "old_string": "a",
                                      "new_string": "b"}, policy.write[0])), "leads to")


def test_policy_from_the_environment(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    assert_denied(hook([], event("Write", {"file_path": "~/.bashrc", "content": "x"},
                                 policy.write[0]),
                       env={"AGENT_SANDBOX_POLICY": str(policy_file)}), "writing")


@pytest.mark.parametrize(("tool", "tool_input", "fragment"), [
    ("Grep", {"pattern": "KEY", "path": "{R}"}, "lies under the search root"),
    ("Grep", {"pattern": "KEY", "path": "/", "output_mode": "content", "-i": True}, "search"),
    ("Glob", {"pattern": "{H}/.ssh/*"}, "under home"),
    ("NotebookEdit", {"notebook_path": "{H}/.claude/a.ipynb", "new_source": "x",
                      "cell_id": "c1", "edit_mode": "replace"}, "inside harness"),
    ("MultiEdit", {"file_path": "{P}/secret/index",
                   "edits": [{"old_string": "s", "new_string": "t"}]}, "under deny"),
])
def test_denied_calls(world: tuple[Path, Policy], policy_file: Path, tool: str,
                      tool_input: dict[str, object], fragment: str) -> None:
    root, policy = world
    filled = {k: v.replace("{R}", str(root)).replace("{H}", policy.home)
              .replace("{P}", policy.write[0]) if isinstance(v, str) else v
              for k, v in tool_input.items()}
    assert_denied(hook([f"--policy={policy_file}"], event(tool, filled, policy.write[0])),
                  fragment)


@pytest.mark.parametrize(("tool", "tool_input"), [
    ("Glob", {"pattern": "**/*.py", "path": "src"}),
    ("Grep", {"pattern": "x", "path": "{H}/.config/gh"}),
    ("Write", {"file_path": "{H}/.claude/memory/MEMORY.md", "content": "m"}),
    ("Bash", {"command": "cat ~/.ssh/id"}),
    ("WebFetch", {"url": "https://example.com", "prompt": "p"}),
])
def test_allowed_calls_and_other_tools_print_nothing(world: tuple[Path, Policy],
                                                     policy_file: Path, tool: str,
                                                     tool_input: dict[str, object]) -> None:
    _, policy = world
    filled = {k: v.replace("{H}", policy.home) if isinstance(v, str) else v
              for k, v in tool_input.items()}
    assert_silent(hook([f"--policy={policy_file}"], event(tool, filled, policy.write[0])))


@pytest.mark.parametrize(("stdin", "fragment"), [
    (b"", "not JSON"),
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"tool_name": "Read", "tool_input": {}, "cwd": "/"}', "file_path"),
    (b'{"tool_name": "Read", "tool_input": {"file_path": 5}, "cwd": "/"}', "not a string"),
    (b'{"tool_name": "Read", "tool_input": {"file_path": "x"}}', "cwd"),
    (b'{"tool_name": "Read", "tool_input": "x", "cwd": "/"}', "tool_input"),
    (b'{"tool_input": {}, "cwd": "/"}', "tool_name"),
    (b'{"hook_event_name": "PostToolUse", "tool_name": "Read"}', "PostToolUse"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100000, "deeply"),
])
def test_unusable_input_exits_2(policy_file: Path, stdin: bytes, fragment: str) -> None:
    done = hook([f"--policy={policy_file}"], stdin)
    assert done.returncode == 2
    assert done.stdout == ""
    assert fragment in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "cannot read policy"),
    ("{", "not valid JSON"),
    ('{"home": "/h", "allow": []}', "'allow'"),
    ('{"home": "h"}', "'home'"),
    ('{"home": "/h", "write": ["/h/p/"]}', "'write'"),
])
def test_unusable_policy_exits_2(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "policy.json"
    if content is not None:
        path.write_text(content)
    done = hook([f"--policy={path}"], event("Read", {"file_path": "/etc/hostname"}, "/"))
    assert (done.returncode, done.stdout) == (2, "")
    assert fragment in done.stderr and "Traceback" not in done.stderr


def test_no_policy_exits_2() -> None:
    done = hook([], event("Read", {"file_path": "/etc/hostname"}, "/"))
    assert done.returncode == 2 and "AGENT_SANDBOX_POLICY" in done.stderr


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--version"]])
def test_help_and_version_exit_0(argv: list[str]) -> None:
    done = hook(argv, b"")
    assert done.returncode == 0 and done.stdout and not done.stderr


@pytest.mark.parametrize("argv", [["--bogus"], ["check", "read"], ["check", "exec", "/x"],
                                  ["render", "extra"], ["--policy"]])
def test_usage_errors_exit_2_with_usage(argv: list[str]) -> None:
    done = hook(argv, b"")
    assert done.returncode == 2
    assert "Usage:" in done.stderr and done.stdout == ""


def test_check_prints_each_decision(world: tuple[Path, Policy], policy_file: Path) -> None:
    _, policy = world
    proj = policy.write[0]
    done = hook(["check", f"--policy={policy_file}", "read", "src/main.py", "to_ssh/id"], b"",
                cwd=proj)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("allow read src/main.py: ") and "under write" in lines[0]
    assert lines[1].startswith("deny read to_ssh/id: ") and "under home" in lines[1]
    done = hook(["check", "write", f"{proj}/x.py"], b"",
                env={"AGENT_SANDBOX_POLICY": str(policy_file)})
    assert done.returncode == 0 and done.stdout.startswith("allow write ")


def test_check_with_a_bad_policy_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"home": "/h", "tool-write": []}')
    done = hook(["check", f"--policy={path}", "read", "/x"], b"")
    assert done.returncode != 0 and "'tool-write'" in done.stderr
    assert "Traceback" not in done.stderr


def test_render_prints_the_drop_in(policy_file: Path) -> None:
    done = hook(["render", f"--policy={policy_file}"], b"")
    assert done.returncode == 0, done.stderr
    settings_doc = json.loads(done.stdout)
    assert "enabled" not in settings_doc["sandbox"]  # Claude Code's own sandbox: the user's
    command = settings_doc["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert f"--policy={policy_file}" in command
    assert command.startswith('[ -z "${AGENT_SANDBOX+x}${AGENT_SANDBOX_POLICY+x}" ] && exit 0;')


# --- property tests: no input makes the hook do anything but deny, stay silent or exit 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12,
)
tool_names = st.sampled_from(["Read", "Grep", "Glob", "Edit", "MultiEdit", "Write",
                              "NotebookEdit", "Bash", "read", ""])
path_like = st.one_of(
    st.text(alphabet="/.~a\\*?[]{}\x00-", max_size=30),
    st.sampled_from(["/", "~", "..", "/proc/self/root/", "/proc/1/cwd", "/dev/fd/0", ""]),
    json_values,
)
tool_inputs = st.fixed_dictionaries(
    {}, optional={"file_path": path_like, "notebook_path": path_like, "path": path_like,
                  "pattern": path_like, "glob": path_like},
)
events = st.fixed_dictionaries(
    {"tool_name": tool_names | json_values, "tool_input": tool_inputs | json_values},
    optional={"cwd": path_like, "hook_event_name": st.just("PreToolUse") | json_values,
              "session_id": json_values},
)
stdin_bytes = st.one_of(
    st.binary(max_size=200),
    events.map(lambda e: json.dumps(e).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
)


def _assert_outcome(status: int, out: str, err: str) -> None:
    assert status in (0, 2), (status, out, err)
    assert "Traceback" not in err and "internal error" not in err
    if status == 2:
        assert out == "" and err.startswith("policy-hook: ")
    elif out:
        assert out.startswith(DENY_PREFIX) and out.endswith("}}\n")
        assert json.loads(out)["hookSpecificOutput"]["permissionDecision"] == "deny"
    else:
        assert err == ""


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=stdin_bytes)
def test_any_stdin_in_process(policy_file: Path, data: bytes) -> None:
    cwd = os.getcwd()
    try:
        _assert_outcome(*run_hook(str(policy_file), data))
    finally:
        os.chdir(cwd)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=stdin_bytes)
def test_any_stdin_real_process(policy_file: Path, data: bytes) -> None:
    done = hook([f"--policy={policy_file}"], data)
    _assert_outcome(done.returncode, done.stdout, done.stderr)
