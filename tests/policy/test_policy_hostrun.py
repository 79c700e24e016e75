"""Host-run files: the one list, the hook's denials, and a hook that fails closed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from libpolicy.decide import writable
from libpolicy.hostrun import DEFAULT, ENTRIES, HostRunError, Table, match, match_path
from libpolicy.hostrun import gitlink_verdict as gitlink_verdict
from libpolicy.model import Policy
from libpolicy.render import render_settings, session_settings

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from test_policy_hook_cli import event, hook  # noqa: E402

# --- the list as data ---------------------------------------------------------------

HELD = [
    (".git", "git-dir"),
    (".git/hooks", "git-hooks"),
    (".git/hooks/pre-commit", "git-hooks"),
    (".git/config", "git-config"),
    (".git/commondir", "git-commondir"),
    (".git/config.worktree", "git-config-worktree"),
    ("sub/.git/hooks/post-checkout", "git-hooks"),
    ("a/b/c/.git/config", "git-config"),
    (".git/modules/x/hooks/pre-commit", "git-hooks"),
    (".git/modules/libs/deep/config", "git-config"),
    (".git/modules/a/modules/b/hooks/x", "git-hooks"),
    (".git/worktrees/wt/commondir", "git-commondir"),
    (".gitmodules", "gitmodules"),
    ("sub/.gitmodules", "gitmodules"),
    (".claude/settings.json", "claude-settings"),
    ("pkg/.claude/settings.local.json", "claude-settings-local"),
    (".claude/commands/x.md", "claude-commands"),
    (".claude/agents/a.md", "claude-agents"),
    (".mcp.json", "mcp"),
    (".gemini/settings.json", "gemini-settings"),
    (".codex/config.toml", "codex-config"),
    (".vscode/tasks.json", "vscode"),
    ("x/.idea/workspace.xml", "idea"),
    (".envrc", "envrc"),
    ("deep/er/.bashrc", "bashrc"),
    (".bash_profile", "bash-profile"),
    (".zshrc", "zshrc"),
    (".zprofile", "zprofile"),
    (".profile", "profile"),
    (".ripgreprc", "ripgreprc"),
    (".gitconfig", "gitconfig"),
    # globbed: every name with that suffix, at any depth
    ("x.code-workspace", "code-workspace"),
    ("a/b/my project.code-workspace", "code-workspace"),
    (".code-workspace", "code-workspace"),
    # git hook managers: the installed hook runs what their config names
    (".pre-commit-config.yaml", "pre-commit-config"),
    ("svc/.pre-commit-config.yaml", "pre-commit-config"),
    ("lefthook.yml", "lefthook"),
    ("sub/.lefthook.yml", "lefthook-dot"),
    # other agents' and editors' project files
    (".gemini/commands/deploy.toml", "gemini-commands"),
    ("web/.cursor/mcp.json", "cursor-mcp"),
    (".zed/tasks.json", "zed"),
    (".exrc", "exrc"),
    (".nvimrc", "nvimrc"),
    ("x/.nvim.lua", "nvim-lua"),
]

FREE = ["src/main.py", ".git/objects/ab/cdef", ".git/HEAD", ".git/refs/heads/main",
        ".git/index", "config", "hooks/pre-commit", ".claude/memory.md", ".claudeX/settings.json",
        "x.envrc", ".git/modules/x/objects/config-ish", ".gitignore", ".claude.json",
        "x.code-workspace.bak", "x.code-workspace/inside.txt", "code-workspace",
        ".pre-commit-config.yaml.orig", ".pre-commit-hooks.yaml", ".cursor/rules/x.mdc",
        ".gemini/GEMINI.md", "lefthook.yml.sample"]


@pytest.mark.parametrize(("rel", "rule"), HELD)
def test_every_entry_matches_at_any_depth(rel: str, rule: str) -> None:
    found = match(rel)
    assert found is not None and found.rule == rule
    assert found.reason  # one line that says what runs it


@pytest.mark.parametrize("rel", FREE)
def test_other_files_are_not_held(rel: str) -> None:
    assert match(rel) is None


def test_every_entry_has_a_unique_rule_and_a_reason() -> None:
    rules = [e.rule for e in ENTRIES]
    assert len(rules) == len(set(rules))
    assert all(e.reason and "\n" not in e.reason for e in ENTRIES)


def test_additions_and_opt_outs() -> None:
    table = Table(add=(".pre-commit-config.yaml", ".husky/"),
                  allow=("vscode", ".envrc", "docs/.idea"))
    assert table.match("a/.pre-commit-config.yaml") is not None
    assert table.match(".husky/pre-commit") is not None
    assert table.match(".vscode/tasks.json") is None  # by rule id
    assert table.match("x/.envrc") is None  # by pattern
    assert table.match("docs/.idea/x.xml") is None  # one place only
    assert table.match("src/.idea/x.xml") is not None
    assert Table.from_dict(table.to_dict()).to_dict() == table.to_dict()
    for bad in ("/abs", "../up", "a/../b", "", "a//b", "*", "a*b", "x/*", "a?", "[ab]"):
        with pytest.raises(HostRunError):
            Table(add=(bad,))


@pytest.mark.parametrize(("add", "rel", "held"), [
    ("*.just", "a/b/x.just", True),
    ("*.just", "x.just.txt", False),
    ("tools/*.sh", "tools/run.sh", True),
    ("tools/*.sh", "x/tools/run.sh", True),
    ("tools/*.sh", "tools/sub/run.sh", False),
    ("*.d/", "conf.d/x", True),
    ("*.d/", "conf.d", True),
    ("*.d/", "confd/x", False),
])
def test_a_users_addition_may_be_a_suffix(add: str, rel: str, held: bool) -> None:
    found = Table(add=(add,)).match(rel)
    assert (found is not None) == held
    assert found is None or found.rule == f"user:{add}"


def test_a_globbed_entry_is_turned_off_by_its_rule_or_pattern() -> None:
    for allow in ("code-workspace", "*.code-workspace"):
        assert Table(allow=(allow,)).match("x.code-workspace") is None
    assert Table(allow=("docs",)).match("docs/x.code-workspace") is None
    assert Table(allow=("docs",)).match("src/x.code-workspace") is not None


def test_home_entries_count_only_in_home() -> None:
    assert match_path("/h/.claude.json", "/h") is not None
    assert match_path("/h/.claude/plugins/p/hooks.json", "/h") is not None
    assert match_path("/h/proj/.claude.json", "/h") is None
    assert match_path("/h/.claude/settings.json", "/h") is not None


def test_the_workdir_root_is_not_matched_against_its_own_ancestors() -> None:
    table = Table(root="/h/.idea/proj")
    assert match_path("/h/.idea/proj/src/x.py", "/h", table) is None
    assert match_path("/h/.idea/proj/.envrc", "/h", table) is not None
    assert match_path("/h/.idea/other.xml", "/h", table) is not None


# --- the hook and `check` -----------------------------------------------------------

def _policy(tmp_path: Path, **extra: object) -> tuple[Path, Policy]:
    home = tmp_path / "home"
    work = home / "proj"
    (work / ".git/hooks").mkdir(parents=True)
    (home / ".claude").mkdir()
    policy = Policy(str(home), write=[str(work), str(home / ".claude"), str(home / ".claude.json")],
                    tool_write=[str(home / ".claude")], **extra)  # type: ignore[arg-type]
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    return path, policy


@pytest.mark.parametrize("tool", ["Write", "Edit", "MultiEdit", "NotebookEdit"])
@pytest.mark.parametrize("rel", [".git/hooks/pre-commit", ".git/config", "sub/.git/commondir",
                                 ".claude/settings.json", ".mcp.json", ".vscode/tasks.json",
                                 ".envrc", ".git/modules/m/hooks/post-merge",
                                 "x.code-workspace", "sub/.pre-commit-config.yaml"])
def test_the_hook_denies_every_writing_tool_on_every_entry(tmp_path: Path, tool: str,
                                                           rel: str) -> None:
    path, policy = _policy(tmp_path)
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    done = hook([f"--policy={path}"], event(tool, {key: rel, "content": "x"}, policy.write[0]))
    assert done.returncode == 0, done.stderr
    reason = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    entry = match(rel)
    assert entry is not None and f"rule {entry.rule}" in reason


@pytest.mark.parametrize("rel", [".claude.json", ".claude/settings.json",
                                 ".claude/plugins/x/hooks/hooks.json", ".codex/config.toml",
                                 ".gemini/settings.json"])
def test_home_agent_config_is_denied_even_under_a_write_grant(tmp_path: Path, rel: str) -> None:
    _, policy = _policy(tmp_path)
    ok, why = writable(policy, os.path.join(policy.home, rel))
    assert not ok and "host-run" in why
    assert writable(policy, os.path.join(policy.home, ".claude/memory/x.md"))[0]


def test_check_write_explains_the_rule(tmp_path: Path) -> None:
    path, policy = _policy(tmp_path)
    done = subprocess.run([sys.executable, "-m", "bin.policy_hook", "check", f"--policy={path}",
                           "write", ".git/hooks/x", "src/ok.py"],
                          cwd=policy.write[0], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)})
    assert done.returncode == 1
    deny, allow = done.stdout.splitlines()
    assert deny.startswith("deny write .git/hooks/x:") and "rule git-hooks" in deny
    assert "git on the host runs" in deny
    assert allow.startswith("allow write src/ok.py")


def test_the_policy_carries_the_users_additions(tmp_path: Path) -> None:
    table = Table(add=(".husky/",), allow=("envrc",), root=str(tmp_path / "home/proj"))
    path, policy = _policy(tmp_path, hostrun=table)
    loaded = Policy.load(str(path))
    assert loaded.hostrun.to_dict() == table.to_dict()
    assert not writable(loaded, policy.write[0] + "/.husky/pre-commit")[0]
    assert writable(loaded, policy.write[0] + "/.envrc")[0]
    assert Policy.load(str(path)) == policy
    assert Policy(policy.home).hostrun is DEFAULT


# --- the rendered command fails closed (issue 15, item 2) ---------------------------

def _rendered(policy_file: str, session: bool = False) -> str:
    """The drop-in's hook command, or (``session``) the one a session's settings carry."""
    policy = Policy("/h")
    render = session_settings if session else render_settings
    return str(render(policy, policy_file)["hooks"]["PreToolUse"][0]["hooks"][0]["command"])


def _run(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command as Claude Code runs it; in a session (AGENT_SANDBOX=1) unless ``env`` says."""
    stdin = event("Read", {"file_path": "/h/.ssh/id_rsa"}, "/")
    env = env or {"AGENT_SANDBOX": "1"}
    return subprocess.run(["sh", "-c", command], input=stdin.decode(), capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], **env}, cwd="/",
                          timeout=30, check=False)


@pytest.mark.parametrize("session", [False, True], ids=["drop-in", "session"])
def test_rendered_hook_with_a_missing_interpreter_exits_2(tmp_path: Path, session: bool) -> None:
    (tmp_path / "p.json").write_text(Policy("/h").to_json())
    command = _rendered(str(tmp_path / "p.json"), session)
    assert shlex.quote(sys.executable) + " " in command
    gone = command.replace(shlex.quote(sys.executable), shlex.quote(str(tmp_path / "python9")), 1)
    done = _run(gone)
    assert done.returncode == 2, done


@pytest.mark.parametrize("session", [False, True], ids=["drop-in", "session"])
def test_rendered_hook_with_a_missing_module_exits_2(tmp_path: Path, session: bool) -> None:
    (tmp_path / "p.json").write_text(Policy("/h").to_json())
    command = _rendered(str(tmp_path / "p.json"), session)
    root = json.dumps(str(HERE.parent.parent))
    assert root in command
    moved = command.replace(root, json.dumps(str(tmp_path / "moved-checkout")))
    done = _run(moved)
    assert done.returncode == 2, done
    assert "policy-hook cannot start: ModuleNotFoundError" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("session", [False, True], ids=["drop-in", "session"])
@pytest.mark.parametrize("kind", ["absent", "a directory", "not json", "unreadable"])
def test_rendered_hook_with_an_unusable_policy_exits_2(
    tmp_path: Path, kind: str, session: bool
) -> None:
    policy = tmp_path / "p.json"
    if kind == "a directory":
        policy.mkdir()
    elif kind == "not json":
        policy.write_text("{")
    elif kind == "unreadable":
        policy.write_text(Policy("/h").to_json())
        policy.chmod(0)
        if os.access(policy, os.R_OK):  # root reads anything: make it a dangling link instead
            policy.unlink()
            policy.symlink_to(tmp_path / "nowhere" / "p.json")
    done = _run(_rendered(str(policy), session))
    assert done.returncode == 2, done
    assert done.stdout == ""


@pytest.mark.parametrize("session", [False, True], ids=["drop-in", "session"])
def test_rendered_hook_still_allows_and_denies(tmp_path: Path, session: bool) -> None:
    (tmp_path / "p.json").write_text(Policy("/h").to_json())
    done = _run(_rendered(str(tmp_path / "p.json"), session))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_the_drop_ins_hook_does_nothing_outside_a_session(tmp_path: Path) -> None:
    """Machine-wide, it must leave every other claude alone: no Python start, exit 0."""
    command = _rendered(str(tmp_path / "absent.json"))
    gone = command.replace(shlex.quote(sys.executable), shlex.quote(str(tmp_path / "python9")), 1)
    for cmd in (command, gone):
        done = _run(cmd, HOME="/h")  # neither AGENT_SANDBOX nor AGENT_SANDBOX_POLICY
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("var", ["AGENT_SANDBOX", "AGENT_SANDBOX_POLICY"])
def test_a_session_variable_set_even_empty_keeps_the_hook_on(tmp_path: Path, var: str) -> None:
    """A settings file's env can set a variable to "", never unset it: that still counts."""
    (tmp_path / "p.json").write_text(Policy("/h").to_json())
    done = _run(_rendered(str(tmp_path / "p.json")), **{var: ""})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    missing = _run(_rendered(str(tmp_path / "absent.json")), **{var: ""})
    assert missing.returncode == 2


# --- gitdir: and commondir targets ----------------------------------------------------

GIT_DIRS = frozenset({".git", ".git/modules/m", ".git/worktrees/w", "sub/.git", "bare.git"})


@pytest.mark.parametrize(("target", "allowed", "why"), [
    (".git/modules/m", True, ""),
    (".git/worktrees/w/", True, ""),
    ("sub/.git", True, ""),
    ("bare.git", True, ""),
    (".git", True, ""),
    (None, False, "outside the workdir"),
    (".git/modules/m/x/g", False, "inside the git directory .git/modules/m"),
    (".git/objects/ab", False, "inside the git directory .git,"),
    (".git/modules/new", False, "inside the git directory .git,"),
    ("sub/.git/../.git", False, "inside the git directory sub/.git"),
    ("elsewhere", False, "not a guarded git directory"),
    ("", False, "not a guarded git directory"),
    ("sub", False, "not a guarded git directory"),
])  # fmt: skip
def test_gitlink_verdict(target: str | None, allowed: bool, why: str) -> None:
    verdict = gitlink_verdict(target, GIT_DIRS)
    assert (verdict is None) is allowed
    assert why in (verdict or "")


def test_gitlink_into_a_bare_workdir() -> None:
    assert gitlink_verdict("", frozenset({""})) is None
    assert "inside the git directory ." in (gitlink_verdict("hooks", frozenset({""})) or "")
