"""A login made inside for another account than the host's: refused unless opted in.

The pure comparison (libegress.login_account), table-driven for each agent's
records, and the keeper's ``--store`` through the real command: the host's
file unchanged on a refusal, replaced with ``--switch-ok``; a first login
(no file) kept; the periodic run with no file says nothing (exit 3).  The
session-level proof is in tests/agents/test_login_first_e2e.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from libegress.login_account import held_account, new_account, same_account
from libegress.oauth_login import ABSENT_STATUS, CLAUDE, CODEX, GEMINI, KINDS


def _jwt(claims: dict[str, object]) -> str:
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{raw}.REALSIG"


def _codex_id(account: str, user: str = "user-1", email: str = "p@example.com") -> str:
    return _jwt({"email": email, "sub": f"auth0|{user}", "https://api.openai.com/auth": {
        "chatgpt_account_id": account, "chatgpt_user_id": user}})


CLAUDE_BESIDE = {"oauthAccount": {"accountUuid": "acct-A", "emailAddress": "P@Example.com"}}
GEMINI_FILE = {"access_token": "a", "refresh_token": "r", "expiry_date": 1,
               "id_token": _jwt({"sub": "111", "email": "p@example.com"})}

ACCOUNTS = [
    # (kind, the host's file, the file beside it, the new answer, same account?)
    ("claude", {}, CLAUDE_BESIDE, {"account": {"uuid": "acct-A",
                                               "email_address": "p@example.com"}}, True),
    ("claude", {}, CLAUDE_BESIDE, {"account": {"uuid": "acct-B",
                                               "email_address": "p@example.com"}}, False),
    ("claude", {}, CLAUDE_BESIDE, {"account": {"uuid": "acct-A",
                                               "email_address": "q@example.com"}}, False),
    ("claude", {}, CLAUDE_BESIDE, {"access_token": "a"}, None),  # the answer names none
    ("claude", {}, None, {"account": {"uuid": "acct-A"}}, None),  # the host records none
    ("claude", {}, {"oauthAccount": "acct-A"}, {"account": {"uuid": "acct-A"}}, None),
    ("codex", {"tokens": {"id_token": _codex_id("ws-1"), "account_id": "ws-1"}}, None,
     {"id_token": _codex_id("ws-1")}, True),
    ("codex", {"tokens": {"id_token": _codex_id("ws-1"), "account_id": "ws-1"}}, None,
     {"id_token": _codex_id("ws-2")}, False),  # another workspace
    ("codex", {"tokens": {"id_token": _codex_id("ws-1"), "account_id": "ws-1"}}, None,
     {"id_token": _codex_id("ws-1", user="user-2", email="q@example.com")}, False),
    ("codex", {"tokens": {"account_id": "ws-1"}}, None, {"id_token": "not-a-jwt"}, None),
    ("codex", {"tokens": {"account_id": "ws-1"}}, None, {"id_token": _codex_id("ws-1")}, True),
    ("codex", {"tokens": {"id_token": _codex_id("ws-1"), "account_id": "ws-9"}}, None,
     {"id_token": _codex_id("ws-1")}, False),  # the file's account_id is what Codex uses
    ("gemini", GEMINI_FILE, None, {"id_token": _jwt({"sub": "111", "email": "p@example.com"})},
     True),
    ("gemini", GEMINI_FILE, None, {"id_token": _jwt({"sub": "222", "email": "p@example.com"})},
     False),
    ("gemini", GEMINI_FILE, None, {"access_token": "a"}, None),
    ("gemini", {"access_token": "a"}, {"active": "P@example.com"},
     {"id_token": _jwt({"sub": "1", "email": "p@example.com"})}, True),
    ("gemini", {"access_token": "a"}, {"active": "p@example.com"},
     {"id_token": _jwt({"sub": "1", "email": "q@example.com"})}, False),
    ("gemini", {"access_token": "a"}, {"active": None}, {"id_token": _jwt({"sub": "1"})}, None),
]


@pytest.mark.parametrize(("kind", "data", "beside", "got", "same"), ACCOUNTS)
def test_the_account_of_a_new_login_is_compared_with_the_hosts(
        kind: str, data: object, beside: object, got: dict[str, object],
        same: bool | None) -> None:
    k = KINDS[kind]
    assert same_account(held_account(k, data, beside), new_account(k, got)) is same


def test_accounts_read_from_junk_are_empty() -> None:
    for kind in (CLAUDE, CODEX, GEMINI):
        assert held_account(kind, [1], "x") == {}
        assert new_account(kind, {"account": [1], "id_token": 5}) == {}
    assert same_account({}, {"account": "a"}) is None


def keeper(path: Path, *words: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "libegress.login_keeper", "claude", str(path), *words]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30,
                          check=False)


def _host(tmp_path: Path) -> Path:
    path = tmp_path / ".claude" / ".credentials.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-HOST",
                                                  "refreshToken": "sk-ant-ort01-HOST",
                                                  "expiresAt": 1}}))
    path.chmod(0o600)
    (tmp_path / ".claude.json").write_text(json.dumps(CLAUDE_BESIDE))
    return path


def _answer(account: str) -> str:
    return json.dumps({"access_token": "sk-ant-oat01-NEW", "refresh_token": "sk-ant-ort01-NEW",
                       "expires_in": 3600, "account": {"uuid": account}})


@pytest.mark.parametrize(("account", "why"), [
    ("acct-B", "another account than"),
    ("", "an account that cannot be told from"),
])
def test_the_keeper_keeps_the_hosts_login_against_another_account(
        tmp_path: Path, account: str, why: str) -> None:
    path = _host(tmp_path)
    before = path.read_text()
    done = keeper(path, "--store", stdin=_answer(account))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"refused": (
        f"claude's new login is for {why} the one logged in on the host: not kept "
        "(unsafe_login_switch = true lets a login made inside replace it)")}
    assert path.read_text() == before and "NEW" not in done.stdout


@pytest.mark.parametrize(("padding", "link"), [(0, False), (3 << 20, False), (10, True)])
def test_the_same_account_is_kept_whatever_the_size_of_claudes_config(
        tmp_path: Path, padding: int, link: bool) -> None:
    """~/.claude.json is often over 1 MiB, and may be a dotfiles manager's link."""
    path = _host(tmp_path)
    config = tmp_path / ("dots.json" if link else ".claude.json")
    if link:
        (tmp_path / ".claude.json").unlink()
        (tmp_path / ".claude.json").symlink_to(config)
    config.write_text(json.dumps(
        {"projects": {"/p": {"history": ["x" * padding]}}, **CLAUDE_BESIDE}))
    done = keeper(path, "--store", stdin=_answer("acct-A"))
    assert done.returncode == 0 and "refused" not in done.stdout, done.stdout + done.stderr
    assert "sk-ant-oat01-NEW" in path.read_text()


def test_switch_ok_lets_another_account_replace_it(tmp_path: Path) -> None:
    path = _host(tmp_path)
    done = keeper(path, "--store", "--switch-ok", stdin=_answer("acct-B"))
    assert done.returncode == 0, done.stderr
    assert "sk-ant-oat01-NEW" in path.read_text() and "NEW" not in done.stdout


def test_with_no_login_file_the_keeper_says_nothing_and_a_store_makes_the_first(
        tmp_path: Path) -> None:
    path = tmp_path / ".claude" / ".credentials.json"
    quiet = keeper(path)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (ABSENT_STATUS, "", "")
    done = keeper(path, "--store", stdin=_answer("acct-Z"))  # nothing held: nothing to compare
    assert done.returncode == 0, done.stderr
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert keeper(path).stdout == "sk-ant-oat01-NEW\n"
