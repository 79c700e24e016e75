"""agent_argv: the agents' own sandbox flags translated, every other command left as typed.

Pure: the real CLIs run these command lines in tests/agents/test_agent_flags_e2e.py.
"""

from __future__ import annotations

import pytest

from libbroker.launcher import agents
from libbroker.launcher.agent_argv import FULL, session_argv

PIN = ["-c", f'sandbox_mode="{FULL}"']
OTHERS = (["bash", "-c", "echo hi"], ["env"], ["/usr/bin/env", "-i", "true"], ["python3", "-c",
          "print(1)"], ["bash", "-c", "codex -s workspace-write exec x"])


@pytest.mark.parametrize("name", sorted(agents.PROFILES))
@pytest.mark.parametrize("cmd", OTHERS)
def test_a_command_that_is_not_the_agent_runs_as_typed(name: str, cmd: list[str]) -> None:
    got = session_argv(agents.PROFILES[name], list(cmd))
    assert got.argv == cmd and got.note == "" and not got.read_only


def test_no_profile_changes_nothing() -> None:
    assert session_argv(None, ["codex", "-s", "read-only"]).argv == ["codex", "-s", "read-only"]


@pytest.mark.parametrize(
    ("args", "want", "read_only"),
    [
        (["--version"], ["--version"], False),
        (["-s", "workspace-write", "exec", "x"], ["-s", FULL, "exec", "x"], False),
        (["exec", "--sandbox", "workspace-write", "x"], ["exec", "-s", FULL, "x"], False),
        (["--sandbox=workspace-write"], ["-s", FULL], False),
        (["-sworkspace-write"], ["-s", FULL], False),
        (["-s=read-only", "exec", "x"], ["-s", FULL, "exec", "x"], True),
        (["-s", "read-only", "resume", "--last"], ["-s", FULL, "resume", "--last"], True),
        (["-s", FULL, "exec", "x"], ["-s", FULL, "exec", "x"], False),
        (["-s", "bogus"], ["-s", "bogus"], False),  # Codex's own error, as typed
        # Interactive: --full-auto meant -a on-request, which only the interactive CLI has.
        (["--full-auto"], ["-a", "on-request", "-s", FULL], False),
        (["--full-auto", "fix it"], ["-a", "on-request", "-s", FULL, "fix it"], False),
        (["-m", "exec", "--full-auto"], ["-a", "on-request", "-m", "exec", "-s", FULL], False),
        (["-a", "never", "--full-auto"], ["-a", "never", "-s", FULL], False),
        (["exec", "--full-auto", "x"], ["exec", "-s", FULL, "x"], False),
        (["e", "--full-auto", "x"], ["e", "-s", FULL, "x"], False),
        # --approve-for-me forces workspace-write: translated, its reviewer kept.
        (["--approve-for-me"], ["-a", "on-request", "-c", 'approvals_reviewer="auto_review"',
                                "-s", FULL], False),
        (["--not-so-yolo", "exec", "x"], ["-c", 'approvals_reviewer="auto_review"', "-s", FULL,
                                          "exec", "x"], False),
        # After --, every word is the prompt's.
        (["exec", "--", "-s", "read-only"], ["exec", "--", "-s", "read-only"], False),
    ],
)
def test_codex_sandbox_flags_are_translated(
    args: list[str], want: list[str], read_only: bool
) -> None:
    got = session_argv(agents.CODEX, ["codex", *args])
    assert got.argv == ["codex", *PIN, *want]
    assert got.read_only is read_only
    translated = want != args
    assert bool(got.note) is translated
    if translated:
        assert "\n" not in got.note and f"runs as -s {FULL}" in got.note
        assert ("workdir is read-only" in got.note) is read_only


def test_codex_by_its_path_is_the_agent() -> None:
    got = session_argv(agents.CODEX, ["/usr/bin/codex", "-s", "workspace-write"])
    assert got.argv == ["/usr/bin/codex", *PIN, "-s", FULL]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["-s", "-p", "x"], ["-p", "x"]),
        (["--sandbox", "-p", "x"], ["-p", "x"]),
        (["--sandbox=true", "-p", "x"], ["-p", "x"]),
        (["-s", "true", "-p", "x"], ["-p", "x"]),
        (["-ys", "-p", "x"], ["-y", "-p", "x"]),
        (["-p", "x", "-s"], ["-p", "x"]),
        (["-mflash-s", "-s"], ["-mflash-s"]),  # a value, not a group of flags
    ],
)
def test_gemini_sandbox_flag_is_dropped_and_said(args: list[str], want: list[str]) -> None:
    got = session_argv(agents.GEMINI, ["gemini", *args])
    assert got.argv == ["gemini", *want] and not got.read_only
    assert got.note.startswith("gemini -") and "cannot nest" in got.note
    assert "approvals as given" in got.note


@pytest.mark.parametrize("args", [["--sandbox", "false"], ["--sandbox=false"], ["-s", "false"]])
def test_gemini_sandbox_false_is_dropped_silently(args: list[str]) -> None:
    assert session_argv(agents.GEMINI, ["gemini", *args, "-p", "x"]) == (
        ["gemini", "-p", "x"], "", False)


def test_gemini_without_the_flag_is_as_typed() -> None:
    cmd = ["gemini", "--yolo", "--no-sandbox", "-p", "x"]
    assert session_argv(agents.GEMINI, cmd) == (cmd, "", False)


def test_gemini_prompt_after_double_dash_is_not_a_flag() -> None:
    assert session_argv(agents.GEMINI, ["gemini", "--", "-s"]).note == ""
