"""launcher.logins: an OAuth login seen, its secret made, placeholders in the copy,
and the person's own login never replaced by them.

The sessions are tests/agents/test_claude_login_e2e.py's.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from libbroker.launcher import agent_home, agents, logins, plan
from libbroker.launcher.config import Config, HostFacts, from_mapping
from libegress import placeholders

CLAUDE = agents.PROFILES["claude"]
REAL = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-REAL", "refreshToken": "sk-ant-ort01-REAL",
                          "expiresAt": 1, "scopes": ["user:inference"], "subscriptionType": "max"}}


def home_with_login(tmp_path: Path, data: object = REAL) -> Path:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text(json.dumps(data))
    return home


def cfg_for(home: Path, **keys: object) -> Config:
    facts = HostFacts(home=str(home), cwd=str(home.parent), gh_present=False)
    return from_mapping({"workdir": str(home.parent / "w"), **keys}, facts)


def test_a_login_becomes_a_secret_whose_command_names_only_the_file(tmp_path: Path) -> None:
    home = home_with_login(tmp_path)
    cfg = cfg_for(home, resolve=["platform.claude.com:127.0.0.1:9"], upstream_ca="/ca.pem")
    out, login, line = logins.take(CLAUDE, cfg)
    assert login is not None and login.path == str(home / ".claude" / ".credentials.json")
    (secret,) = out.secrets
    assert (secret.host, secret.header, secret.format) == ("api.anthropic.com", "Authorization",
                                                           "Bearer {}")
    assert shlex.split(secret.command) == [
        sys.executable, "-m", "libegress.login_keeper", "claude", login.path,
        "--resolve=platform.claude.com:127.0.0.1:9", "--ca=/ca.pem"]
    assert "REAL" not in plan.secrets_json(out) and "REAL" not in line
    assert line.startswith("agent-sandbox: claude's login stays on this host")


def test_no_login_yet_gets_the_secrets_for_a_first_login_inside_and_no_line(
        tmp_path: Path) -> None:
    for data in ({}, {"claudeAiOauth": {"accessToken": "a"}}, "x", None):
        home = home_with_login(tmp_path / str(len(str(data))), data)
        if data is None:
            (home / ".claude" / ".credentials.json").unlink()
        cfg = cfg_for(home)
        out, login, line = logins.take(CLAUDE, cfg)
        assert (login, line) == (None, "")
        (secret,) = out.secrets
        assert (secret.host, secret.login) == ("api.anthropic.com", "claude")
        assert shlex.split(secret.command)[3:] == [
            "claude", str(home / ".claude" / ".credentials.json")]
    gemini = logins.take(agents.PROFILES["gemini"], cfg)
    assert gemini[1] is None and {s.login for s in gemini[0].secrets} == {"gemini"}


def test_no_login_and_a_key_for_the_api_host_leaves_the_key_alone(tmp_path: Path) -> None:
    home = home_with_login(tmp_path, {})
    cfg = cfg_for(home, secret=[{"host": "api.anthropic.com", "header": "x-api-key",
                                 "format": "{}", "command": "printenv ANTHROPIC_API_KEY"}])
    assert logins.take(CLAUDE, cfg) == (cfg, None, "")


def test_unsafe_login_switch_reaches_the_keeper(tmp_path: Path) -> None:
    cfg = cfg_for(home_with_login(tmp_path), unsafe_login_switch=True)
    (secret,) = logins.take(CLAUDE, cfg)[0].secrets
    assert shlex.split(secret.command)[-1] == "--switch-ok"
    assert "--switch-ok" not in logins.take(CLAUDE, cfg_for(home_with_login(
        tmp_path / "b")))[0].secrets[0].command


def test_a_host_with_a_key_already_keeps_the_key_and_the_placeholders(tmp_path: Path) -> None:
    cfg = cfg_for(home_with_login(tmp_path), secret=[{
        "host": "api.anthropic.com", "header": "x-api-key", "format": "{}",
        "command": "printenv ANTHROPIC_API_KEY"}])
    out, login, line = logins.take(CLAUDE, cfg)
    assert out == cfg and login is not None and "has a key already" in line


def session_copy(tmp_path: Path, home: Path) -> tuple[str, str, logins.Login]:
    runtime = tmp_path / "rt"
    runtime.mkdir()
    made = agent_home.prepare(CLAUDE, home=str(home), workdir=str(tmp_path / "w"),
                              session="s1", runtime=str(runtime), env={})
    login = logins.detect(CLAUDE, str(home))
    assert login is not None
    logins.placeholder_copy(login, made.root, str(runtime))
    return made.root, str(runtime), login


def test_the_copy_holds_placeholders_and_nothing_of_them_comes_back(tmp_path: Path) -> None:
    home = home_with_login(tmp_path)
    host_file = home / ".claude" / ".credentials.json"
    before = host_file.read_text()
    root, runtime, login = session_copy(tmp_path, home)
    copy = Path(root, login.copy)
    inner = json.loads(copy.read_text())["claudeAiOauth"]
    assert inner == {"scopes": ["user:inference"], "subscriptionType": "max",
                     "accessToken": placeholders.ACCESS, "refreshToken": placeholders.REFRESH,
                     "expiresAt": placeholders.FAR_AHEAD_MS}
    assert "REAL" not in copy.read_text() and os.stat(copy).st_mode & 0o777 == 0o600
    # The agent rewrites it (same placeholders, a new time): still not brought back.
    copy.write_text(json.dumps({"claudeAiOauth": {**inner, "subscriptionType": "pro"}}))
    assert agent_home.write_back(runtime) == []
    assert host_file.read_text() == before


def test_a_new_login_made_inside_comes_back(tmp_path: Path) -> None:
    home = home_with_login(tmp_path)
    root, runtime, login = session_copy(tmp_path, home)
    fresh = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-NEW", "refreshToken": "r-NEW",
                               "expiresAt": 2}}
    Path(root, login.copy).write_text(json.dumps(fresh))
    assert agent_home.write_back(runtime) == []
    assert json.loads((home / ".claude" / ".credentials.json").read_text()) == fresh


def test_codex_holds_jwts_it_can_decode_with_placeholder_signatures(tmp_path: Path) -> None:
    from libegress.oauth_login import jwt_claims

    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    real_id = "eyJhbGciOiJSUzI1NiJ9.eyJlbWFpbCI6ImFAYi5jIiwiZXhwIjoxfQ.REALSIG"
    real_access = "eyJhbGciOiJSUzI1NiJ9.eyJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnt9LCJleHAiOjF9.R2"
    (home / ".codex" / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": {
        "id_token": real_id, "access_token": real_access, "refresh_token": "rt_REAL",
        "account_id": "acct-1"}, "last_refresh": "2026-01-01T00:00:00Z"}))
    codex = agents.PROFILES["codex"]
    out, login, _ = logins.take(codex, cfg_for(home))
    assert login is not None and out.secrets[0].host == "chatgpt.com"
    runtime = tmp_path / "rt"
    runtime.mkdir()
    made = agent_home.prepare(codex, home=str(home), workdir=str(tmp_path / "w"),
                              session="s1", runtime=str(runtime), env={})
    logins.placeholder_copy(login, made.root, str(runtime))
    text = Path(made.root, login.copy).read_text()
    assert "REAL" not in text and "R2" not in text
    tokens = json.loads(text)["tokens"]
    assert tokens["refresh_token"] == placeholders.CODEX_REFRESH
    assert tokens["account_id"] == "acct-1"
    assert jwt_claims(tokens["id_token"]) == {"email": "a@b.c", "exp": 1}
    assert jwt_claims(tokens["access_token"])["exp"] == placeholders.FAR_AHEAD_MS // 1000
    assert tokens["access_token"].endswith(".agent-sandbox-placeholder")
    assert agent_home.write_back(str(runtime)) == []
    assert "rt_REAL" in (home / ".codex" / "auth.json").read_text()


def test_gemini_gets_a_secret_per_host_and_placeholders_without_the_id_token(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "oauth_creds.json").write_text(json.dumps({
        "access_token": "ya29.REAL", "refresh_token": "1//REAL", "scope": "s",
        "token_type": "Bearer", "id_token": "h.p.REALSIG", "expiry_date": 1}))
    gemini = agents.PROFILES["gemini"]
    out, login, _ = logins.take(gemini, cfg_for(home))
    assert login is not None
    assert [s.host for s in out.secrets] == ["cloudcode-pa.googleapis.com",
                                             "oauth2.googleapis.com", "www.googleapis.com"]
    runtime = tmp_path / "rt"
    runtime.mkdir()
    made = agent_home.prepare(gemini, home=str(home), workdir=str(tmp_path / "w"),
                              session="s1", runtime=str(runtime), env={})
    logins.placeholder_copy(login, made.root, str(runtime))
    assert json.loads(Path(made.root, login.copy).read_text()) == {
        "access_token": placeholders.GEMINI_ACCESS, "refresh_token": placeholders.GEMINI_REFRESH,
        "scope": "s", "token_type": "Bearer", "expiry_date": placeholders.FAR_AHEAD_MS}
    assert agent_home.write_back(str(runtime)) == []
    assert "1//REAL" in (home / ".gemini" / "oauth_creds.json").read_text()
