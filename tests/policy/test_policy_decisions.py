"""Table tests of the policy's decisions against a real filesystem with real symlinks.

{H} is home, {P} the workdir (write), {R} the world's root; a cwd of None is
the workdir.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libpolicy.decide import (
    read_rule,
    readable,
    search_root_readable,
    search_rule,
    writable,
    write_rule,
)
from libpolicy.model import Policy

ALLOW, DENY = True, False

READ = [
    ("{P}/src/main.py", ALLOW, "under write"),
    ("src/main.py", ALLOW, "under write"),
    ("./src/../src/main.py", ALLOW, ""),
    ("{P}//src///main.py", ALLOW, ""),
    ("{P}/src/", ALLOW, ""),
    ("{H}/.ssh/id", DENY, "under home"),
    ("../.ssh/id", DENY, "under home"),
    ("{P}/../.ssh/id", DENY, "under home"),
    ("{P}/src/../../.ssh/id", DENY, "under home"),
    ("~/.ssh/id", DENY, "under home"),
    ("~", DENY, "under home"),
    ("/{H}/.ssh/id", DENY, "under home"),
    ("{H}/../home/.ssh/id", DENY, "under home"),
    ("{H}", DENY, "under home"),
    ("{P}/to_ssh/id", DENY, "leads to"),
    ("to_ssh/id", DENY, "leads to"),
    ("{P}/rel_ssh/id", DENY, "leads to"),
    ("{P}/chain1/id", DENY, "leads to"),
    ("{P}/to_home/.ssh/id", DENY, "leads to"),
    ("{P}/src/deep/.ssh/id", DENY, "leads to"),
    ("{P}/to_ssh/../.ssh/id", DENY, "leads to"),
    ("{P}/to_ssh/../proj/src/main.py", ALLOW, "under write"),
    ("{P}/dangling", DENY, "leads to"),
    ("{P}/dangling_ok", ALLOW, ""),
    ("{P}/to_outside/sub/file", ALLOW, "outside home"),
    ("{P}/to_secret/index", DENY, "under deny"),
    ("{P}/secret/index", DENY, "under deny"),
    ("{P}/secret", DENY, "under deny"),
    ("{P}/secretive", ALLOW, "under write"),
    ("{H}/.config/gh/hosts.yml", ALLOW, "under read"),
    ("{H}/.config/ghost", DENY, "under home"),
    ("{H}/.config", DENY, "under home"),
    ("{R}/run/egress/ca.pem", ALLOW, "under read"),
    ("{R}/run/agent/sock", DENY, "under runtime"),
    ("{P}/to_run", DENY, "under runtime"),
    ("{H}/.claude/memory/MEMORY.md", ALLOW, "under tool_write"),
    ("{H}/.claude/settings.json", DENY, "under home"),
    ("/proc/self/root{H}/.ssh/id", DENY, "under home"),
    ("/proc/self/root{P}/src/main.py", ALLOW, ""),
    ("/proc/thread-self/root/{H}/.ssh/id", DENY, "under home"),
    ("/proc/self/cwd/src/main.py", ALLOW, ""),
    ("/proc/self/cwd/../.ssh/id", DENY, ""),
    ("/proc/self/cwd/to_ssh/id", DENY, "leads to"),
    ("/proc/self/environ", DENY, "per-process"),
    ("/proc/1/environ", DENY, "per-process"),
    ("/proc/1/root{H}/.ssh/id", DENY, ""),
    ("/proc/self/fd/0", DENY, "per-process"),
    ("/dev/fd/0", DENY, "per-process"),
    ("/etc/passwd", ALLOW, "outside home and runtime"),
    ("{R}/outside/sub/file", ALLOW, "outside home"),
    ("{P}/loop1", DENY, "too many levels"),
    ("{P}/to_self_root/id", DENY, "under home"),
    ("{P}/a\x00b", DENY, "NUL"),
    ("$HOME_OF_TEST/.ssh/id", DENY, "under home"),
    ("${HOME_OF_TEST}/.ssh/id", DENY, "under home"),
    ("$NOT_SET_ANYWHERE/x", ALLOW, "under write"),
]

WRITE = [
    ("{P}/src/new.py", ALLOW, "under write"),
    ("new.py", ALLOW, "under write"),
    ("{P}/secret/x", DENY, "under deny"),
    ("{P}/to_secret/x", DENY, "under deny"),
    ("{P}/dangling", DENY, "not under any write"),
    ("{P}/dangling_ok", ALLOW, ""),
    ("{P}/to_ssh/authorized_keys", DENY, "leads to"),
    ("{H}/.notes", DENY, "not under any write"),
    ("~/.notes", DENY, "not under any write"),
    ("{H}/.bashrc", DENY, "host-run file (rule bashrc"),
    ("{R}/outside/sub/file", DENY, "not under any write"),
    ("/etc/passwd", DENY, "not under any write"),
    ("{H}/.claude/memory/MEMORY.md", ALLOW, "under tool_write"),
    ("{H}/.claude/settings.json", DENY, "rule claude-settings"),
    ("{H}/.claude/plans/p.md", DENY, "inside harness"),
    ("{P}/to_memory/MEMORY.md", ALLOW, ""),
    ("{P}/to_harness/settings.json", DENY, "rule claude-settings"),
    ("{P}/to_harness/plans/p.md", DENY, "inside harness"),
    ("{H}/.claude/memory/../settings.json", DENY, "rule claude-settings"),
    ("{P}/not/yet/there.py", ALLOW, "under write"),
    ("{P}/to_home/not/yet/there", DENY, "leads to"),
    ("{R}/run/egress/x", DENY, "not under any write"),
    ("{H}/.config/gh/hosts.yml", DENY, "not under any write"),
    ("/proc/self/cwd/src/x.py", ALLOW, ""),
    ("/proc/self/root{H}/.bashrc", DENY, ""),
    ("{P}/src/deep/.notes", DENY, "leads to"),
    ("{P}/src/../secret/x", DENY, "under deny"),
]

SEARCH = [
    ("{P}/src", ALLOW, "under write"),
    ("src", ALLOW, ""),
    ("{P}", DENY, "deny"),
    ("{H}", DENY, "under home"),
    ("/", DENY, "lies under the search root"),
    ("{R}", DENY, "home"),
    ("{R}/outside", ALLOW, "outside home"),
    ("{H}/.config/gh", ALLOW, "under read"),
    ("{R}/run", DENY, "runtime"),
    ("{R}/run/egress", ALLOW, "under read"),
    ("/proc", DENY, "/proc"),
    ("{P}/to_ssh", DENY, "leads to"),
    ("/etc", ALLOW, ""),
    ("{P}/secret", DENY, "under deny"),
    ("{P}/..", DENY, "under home"),
    ("~", DENY, "under home"),
]


@pytest.fixture(autouse=True)
def _home_variable(world: tuple[Path, Policy], monkeypatch: pytest.MonkeyPatch) -> None:
    """$HOME_OF_TEST is home, as a variable the harness might hand the hook."""
    monkeypatch.setenv("HOME_OF_TEST", world[1].home)


def _expand(template: str, root: Path, policy: Policy) -> str:
    return (template.replace("{H}", policy.home).replace("{P}", policy.write[0])
            .replace("{R}", str(root)))


def _check(world: tuple[Path, Policy], decide: object, template: str, expected: bool,
           fragment: str) -> None:
    root, policy = world
    assert callable(decide)
    ok, why = decide(policy, _expand(template, root, policy), policy.write[0])
    assert ok is expected, why
    assert fragment in why
    assert why


@pytest.mark.parametrize(("path", "expected", "fragment"), READ)
def test_readable(world: tuple[Path, Policy], path: str, expected: bool, fragment: str) -> None:
    _check(world, readable, path, expected, fragment)


@pytest.mark.parametrize(("path", "expected", "fragment"), WRITE)
def test_writable(world: tuple[Path, Policy], path: str, expected: bool, fragment: str) -> None:
    _check(world, writable, path, expected, fragment)


@pytest.mark.parametrize(("path", "expected", "fragment"), SEARCH)
def test_search_root(world: tuple[Path, Policy], path: str, expected: bool, fragment: str) -> None:
    _check(world, search_root_readable, path, expected, fragment)


def test_proc_of_this_process_in_our_namespace(world: tuple[Path, Policy]) -> None:
    """/proc/<pid>/cwd of a process in our mount namespace is followed, and judged."""
    _, policy = world
    old = os.getcwd()
    try:
        os.chdir(policy.home)
        ok, why = readable(policy, f"/proc/{os.getpid()}/cwd/.ssh/id", "/")
        assert not ok and "under home" in why
        os.chdir(policy.write[0])
        ok, why = readable(policy, f"/proc/{os.getpid()}/cwd/src/main.py", "/")
        assert ok, why
    finally:
        os.chdir(old)


def test_deny_wins_over_every_allow() -> None:
    policy = Policy("/h", read=["/h/a"], write=["/h/a"], tool_write=["/h/a"], deny=["/h/a"],
                    harness="/h/a")
    for rule in (read_rule, write_rule, search_rule):
        ok, why = rule(policy, "/h/a/x")
        assert not ok and "under deny /h/a" in why


def test_write_inside_harness_only_under_tool_write() -> None:
    policy = Policy("/h", write=["/h"], harness="/h/.claude", tool_write=["/h/.claude/mem"])
    assert write_rule(policy, "/h/file")[0]
    assert not write_rule(policy, "/h/.claude/plans/p.md")[0]
    assert write_rule(policy, "/h/.claude/mem/x")[0]


def test_home_that_is_wholly_allowed_may_be_searched() -> None:
    policy = Policy("/h", write=["/h"])
    assert search_rule(policy, "/")[0] is False  # /proc lies beneath
    assert search_rule(policy, "/h")[0]


def test_no_runtime_means_no_runtime_rule() -> None:
    policy = Policy("/h")
    assert read_rule(policy, "/run/user/0/x")[0]
