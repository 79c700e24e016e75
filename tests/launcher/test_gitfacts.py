"""gitfacts' pure rules: git's answers parsed, the workdir chosen, the git dirs granted.

The real git questions (and their safety) are exercised by test_git_workdir.py
and test_git_signing.py in real sessions; here, every rule on its own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from libbroker.broker.ops import not_enabled
from libbroker.launcher import gitfacts
from libbroker.launcher.git_answers import (
    Located,
    default_workdir,
    outside_git_dirs,
    parse_located,
    parse_signing,
)

HOME = "/home/u"


def _z(*entries: tuple[str, str, str, str]) -> bytes:
    return b"".join(f"{s}\0{o}\0{k}\n{v}\0".encode() for s, o, k, v in entries)


def test_the_last_user_signingkey_wins_and_says_where() -> None:
    out = _z(("global", f"file:{HOME}/.gitconfig", "user.signingkey", "GLOBAL"),
             ("local", "file:.git/config", "user.signingkey", "LOCAL"))
    found = parse_signing(0, out, "/r")
    assert found == ("LOCAL", "user.signingkey (local, /r/.git/config)", "")


def test_without_a_signingkey_git_signs_as_the_committer() -> None:
    out = _z(("global", "file:/g", "user.name", " Jo Doe. "),
             ("global", "file:/g", "user.email", "<jo@example.test>"),
             ("local", "file:.git/config", "committer.email", "ci@example.test"))
    found = parse_signing(0, out, "/r")
    assert found.key == "Jo Doe <ci@example.test>"  # crud stripped, committer.* first
    assert "committer" in found.origin and not found.problem
    assert parse_signing(1, b"", "/r") == ("", "", "")  # nothing set: nothing enabled
    assert parse_signing(0, _z(("global", "file:/g", "user.name", "Jo")), "/r").key == ""


@pytest.mark.parametrize("fmt", ["ssh", "x509", "SSH"])
def test_a_format_other_than_openpgp_enables_nothing_and_says_so(fmt: str) -> None:
    out = _z(("local", "file:.git/config", "user.signingkey", "~/.ssh/id.pub"),
             ("local", "file:.git/config", "gpg.format", fmt))
    found = parse_signing(0, out, "/r")
    assert found.key == "" and f"gpg.format is {fmt}" in found.problem
    assert "/r/.git/config" in found.problem and "\n" not in found.problem
    assert parse_signing(0, _z(("local", "file:c", "gpg.format", "openpgp"),
                               ("local", "file:c", "user.signingkey", "K")), "/r").key == "K"


def test_git_failing_or_hanging_is_a_problem_line_not_a_key() -> None:
    assert "exits 128" in parse_signing(128, b"", "/r").problem
    assert "did not answer" in parse_signing(-1, b"", "/r").problem


def test_rev_parse_output() -> None:
    assert parse_located(b"/r\n/r/.git\n/r/.git\n") == Located("/r", "/r/.git", "/r/.git")
    assert parse_located(b"/m/.git\n/m/.git\n") is None  # bare: no top level
    assert parse_located(b"") is None
    assert parse_located(b"r\n/r/.git\n/r/.git\n") is None  # never a relative path


@pytest.mark.parametrize(("cwd", "repo", "want"), [
    ("/w/p", None, "/w/p"),
    ("/w/p/src/x", Located("/w/p", "/w/p/.git", "/w/p/.git"), "/w/p"),
    ("/w/p", Located("/w/p", "/w/p/.git", "/w/p/.git"), "/w/p"),
    (f"{HOME}/notes", Located(HOME, f"{HOME}/.git", f"{HOME}/.git"), f"{HOME}/notes"),
    ("/srv/x", Located("/", "/.git", "/.git"), "/srv/x"),
    ("/elsewhere", Located("/w/p", "/w/p/.git", "/w/p/.git"), "/elsewhere"),
])
def test_the_default_workdir(cwd: str, repo: Located | None, want: str) -> None:
    assert default_workdir(cwd, HOME, repo)[0] == want


def test_git_dirs_outside_the_workdir() -> None:
    own = Located("/w/p", "/w/p/.git", "/w/p/.git")
    assert outside_git_dirs(own, "/w/p", HOME) == ()
    tree = Located("/w/wt", "/w/main/.git/worktrees/wt", "/w/main/.git")
    assert outside_git_dirs(tree, "/w/wt", HOME) == ("/w/main/.git",)
    assert outside_git_dirs(tree, "/w/wt/sub", HOME) == ()  # a named subdirectory
    sub = Located("/w/s/mod", "/w/s/.git/modules/mod", "/w/s/.git/modules/mod")
    assert outside_git_dirs(sub, "/w/s/mod", HOME) == ("/w/s/.git/modules/mod",)
    for bad in ("/", "/home"):
        with pytest.raises(ValueError, match="never granted"):
            outside_git_dirs(Located("/w/t", bad, bad), "/w/t", HOME)


def test_the_refusal_is_one_line_naming_the_enabled_key_and_the_fix() -> None:
    line = not_enabled("K2", frozenset({"K1"}))
    assert "'K2' is not enabled" in line and "(enabled: 'K1')" in line
    assert "start a new session" in line and "\n" not in line
    assert "(enabled: none)" in not_enabled("K", frozenset())
    assert "\\n" in not_enabled("K\nforged", frozenset())  # repr: no line of its own


def test_the_questions_run_nothing_a_repository_names(tmp_path: Path) -> None:
    """fsmonitor, hooks, pagers and aliases a hostile repository sets never run."""
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    mark = tmp_path / "ran"
    cmd = f"touch {mark}"
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(f"[core]\n\tfsmonitor = {cmd}\n\tpager = {cmd}\n\thooksPath = {tmp_path}\n"
                 f"[user]\n\tsigningkey = K\n[alias]\n\tconfig = !{cmd}\n")
    (tmp_path / "post-checkout").write_text(f"#!/bin/sh\n{cmd}\n")
    os.chmod(tmp_path / "post-checkout", 0o755)
    (repo / "sub").mkdir()
    assert gitfacts.locate(str(repo / "sub"), str(tmp_path)) == Located(
        str(repo), str(repo / ".git"), str(repo / ".git"))
    status, out = gitfacts.collect(gitfacts.start_signing(str(repo), str(tmp_path)))
    assert parse_signing(status, out, str(repo)).key == "K"
    assert not mark.exists()


def test_a_git_that_does_not_answer_is_killed(tmp_path: Path) -> None:
    """A config including a FIFO blocks git: the question ends, no process is left."""
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(f"[include]\n\tpath = {fifo}\n")
    proc = gitfacts.start_signing(str(repo), str(tmp_path))
    assert proc is not None
    assert gitfacts.collect(proc, timeout=0.3) == (-1, b"")
    assert proc.returncode is not None  # reaped


def test_the_question_asked_while_the_servers_start_is_the_one_the_config_uses(
    tmp_path: Path,
) -> None:
    from libbroker.launcher import config_file
    from libbroker.launcher.config import HostFacts

    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    (repo / "sub").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    facts = HostFacts(home=str(home), cwd=str(repo / "sub"), gh_present=False)
    gitfacts.ask_early(str(repo / "sub"), str(home))
    early = gitfacts._early[str(repo / "sub")]
    cfg = config_file.load(None, facts)
    assert cfg.workdir == str(repo) and not gitfacts._early
    assert early.returncode == 0  # collected, not asked again
    # Asked about another directory (the file names the workdir): ended, not leaked.
    gitfacts.ask_early(str(tmp_path), str(home))
    other = gitfacts._early[str(tmp_path)]
    assert config_file.load(None, facts).workdir == str(repo)
    assert other.returncode is not None and not gitfacts._early


def test_an_early_question_nobody_takes_is_ended(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    os.mkfifo(tmp_path / "fifo")
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(f"[include]\n\tpath = {tmp_path / 'fifo'}\n")
    gitfacts.ask_early(str(repo), str(tmp_path))
    proc = gitfacts._early[str(repo)]
    gitfacts.discard_early()
    assert proc.returncode is not None and not gitfacts._early
