"""A held login's token host: the pure judgement (token_endpoint), the placeholders
the session gets (placeholders), the new login kept (oauth_login.stored), and the
keeper's ``--answer`` and ``--store`` through the real command.

The session-level proof (curl and the real CLIs inside sessions, both backends)
is in tests/agents/test_*_login_e2e.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libegress import oauth_login, placeholders
from libegress.oauth_login import CLAUDE, CODEX, GEMINI, LoginError, jwt_claims
from libegress.placeholders import MARK
from libegress.secrets import login_hosts, parse_secrets
from libegress.token_endpoint import ENDPOINTS, Action, holds_tokens, judge, params, path_key

JSON = [(b"Content-Type", b"application/json")]
FORM = [(b"Content-Type", b"application/x-www-form-urlencoded")]
HELD = placeholders.REFRESH


def ask(kind: str, body: object, target: bytes = b"", method: bytes = b"POST",
        headers: list[tuple[bytes, bytes]] | None = None) -> tuple[Action, int, str]:
    endpoint = ENDPOINTS[kind]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = judge(endpoint, method, target or endpoint.token_path.encode(),
                JSON if headers is None else headers, raw)
    return got.action, got.status, got.reason


@pytest.mark.parametrize("target", [
    b"/v1/oauth/token", b"/v1/oauth/token?x=1", b"//v1//oauth/token/", b"/V1/OAuth/TOKEN",
    b"/v1/oauth%2Ftoken", b"/v1/oauth%252Ftoken", b"/%761/oauth/token",
])
def test_the_placeholder_refresh_is_answered_on_every_spelling_of_the_path(target: bytes) -> None:
    body = {"grant_type": "refresh_token", "refresh_token": HELD, "client_id": "x"}
    assert ask("claude", body, target)[0] is Action.ANSWER


REFUSALS = [
    # (kind, body, headers, status, reason's end)
    ("claude", {"grant_type": "refresh_token", "refresh_token": "sk-ant-ort01-other"}, JSON, 403,
     "only the session's placeholder refresh token is answered"),
    ("claude", {"grant_type": "refresh_token"}, JSON, 403,
     "only the session's placeholder refresh token is answered"),
    ("claude", {"grant_type": "refresh_token", "refresh_token": [HELD]}, JSON, 403,
     "only the session's placeholder refresh token is answered"),
    ("claude", {"grant_type": "client_credentials", "refresh_token": HELD}, JSON, 403,
     "grant 'client_credentials' is not answered for the session"),
    ("claude", {"grant_type": "authorization_code", "code": HELD}, JSON, 403,
     "grant 'authorization_code' is not answered for the session"),
    ("claude", {"code": "c"}, JSON, 403,
     "a token request with no readable grant_type is not answered for the session"),
    ("claude", b"[1, 2]", JSON, 400, "neither JSON nor a form the proxy can read"),
    ("claude", b"\xff\xfe", JSON, 400, "neither JSON nor a form the proxy can read"),
    ("claude", b"{", JSON, 400, "neither JSON nor a form the proxy can read"),
    ("claude", b"<x/>", [(b"Content-Type", b"text/xml")], 400,
     "neither JSON nor a form the proxy can read"),
    ("gemini", b"grant_type=refresh_token&refresh_token=1//x&refresh_token=1//" +
     MARK.encode(), FORM, 400, "neither JSON nor a form the proxy can read"),
    ("codex", b"grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"
     b"&subject_token=x." + MARK.encode(), FORM, 403,
     "grant 'urn:ietf:params:oauth:grant-type:token-exchange' is not answered for the session"),
    ("codex", b"grant_type=authorization_code&code=c&code_verifier=%61gent-sandbox-placeholder",
     FORM, 403, "grant 'authorization_code' is not answered for the session"),
]


@pytest.mark.parametrize(("kind", "body", "headers", "status", "reason"), REFUSALS)
def test_anything_else_on_the_token_path_is_refused_with_its_reason(
        kind: str, body: object, headers: list[tuple[bytes, bytes]], status: int,
        reason: str) -> None:
    action, got_status, got_reason = ask(kind, body, headers=headers)
    assert (action, got_status) == (Action.REFUSE, status)
    assert got_reason == f"{kind}'s login is held on the host: {reason}" or \
        got_reason == f"{kind}'s token request is {reason}"


def test_other_methods_on_the_token_path_are_refused() -> None:
    assert ask("codex", b"", method=b"GET")[:2] == (Action.REFUSE, 405)


def test_each_agents_refresh_as_its_cli_sends_it_is_answered() -> None:
    claude = {"grant_type": "refresh_token", "refresh_token": placeholders.REFRESH,
              "client_id": CLAUDE.client_id, "scope": "user:inference"}
    codex = {"client_id": CODEX.client_id, "grant_type": "refresh_token",
             "refresh_token": placeholders.CODEX_REFRESH}
    gemini = (f"refresh_token=1%2F%2F{MARK}&client_id={GEMINI.client_id}"
              "&client_secret=GOCSPX-x&grant_type=refresh_token").encode()
    assert ask("claude", claude)[0] is Action.ANSWER
    assert ask("codex", codex)[0] is Action.ANSWER
    assert ask("gemini", gemini, headers=FORM)[0] is Action.ANSWER
    # google-auth-library sends its form with a charset
    charset = [(b"Content-Type", b"application/x-www-form-urlencoded;charset=UTF-8")]
    assert ask("gemini", gemini, headers=charset)[0] is Action.ANSWER


def test_a_code_exchange_goes_upstream_to_be_kept() -> None:
    claude = {"grant_type": "authorization_code", "code": "c", "redirect_uri": "http://x",
              "client_id": CLAUDE.client_id, "code_verifier": "v", "state": "s"}
    codex = b"grant_type=authorization_code&code=c&redirect_uri=http%3A%2F%2Flocalhost&" \
            b"client_id=" + CODEX.client_id.encode() + b"&code_verifier=v"
    assert ask("claude", claude)[0] is Action.EXCHANGE
    assert ask("codex", codex, headers=FORM)[0] is Action.EXCHANGE


GCLOUD = "32555940559.apps.googleusercontent.com"  # gcloud's public client id


@pytest.mark.parametrize(("kind", "body", "headers", "action"), [
    # another client's own traffic on the token host: upstream as it came, answer relayed
    ("gemini", f"client_id={GCLOUD}&client_secret=x&grant_type=refresh_token"
     "&refresh_token=1//gclouds-own".encode(), FORM, Action.RELAY),
    ("gemini", f"client_id={GCLOUD}&grant_type=authorization_code&code=c".encode(), FORM,
     Action.RELAY),
    ("claude", {"grant_type": "client_credentials", "client_id": "another-app"}, JSON,
     Action.RELAY),
    # ... unless it carries a placeholder, which never goes upstream
    ("gemini", f"client_id={GCLOUD}&grant_type=refresh_token&refresh_token=1//{MARK}".encode(),
     FORM, Action.ANSWER),
    ("gemini", f"client_id={GCLOUD}&grant_type=authorization_code&code={MARK}".encode(), FORM,
     Action.REFUSE),
    # the agent's own client: a code exchange is kept, anything else judged as before
    ("gemini", f"client_id={GEMINI.client_id}&grant_type=authorization_code&code=c".encode(),
     FORM, Action.EXCHANGE),
    ("gemini", f"client_id={GEMINI.client_id}&grant_type=refresh_token"
     "&refresh_token=1//other".encode(), FORM, Action.REFUSE),
    # a code exchange with no client id, or an empty one: not the agent's, not another's
    ("claude", {"grant_type": "authorization_code", "code": "c"}, JSON, Action.REFUSE),
    ("claude", {"grant_type": "authorization_code", "code": "c", "client_id": ""}, JSON,
     Action.REFUSE),
    ("claude", {"grant_type": "authorization_code", "code": "c", "client_id": [1]}, JSON,
     Action.REFUSE),
])
def test_only_the_agents_own_client_and_placeholders_are_taken_on_the_token_path(
        kind: str, body: object, headers: list[tuple[bytes, bytes]], action: Action) -> None:
    assert ask(kind, body, headers=headers)[0] is action


@pytest.mark.parametrize(("headers", "action"), [
    ([(b"Authorization", f"Bearer ya29.{MARK}".encode())], Action.INJECT),
    ([(b"authorization", b"Bearer ya29.%61gent-sandbox-placeholder")], Action.INJECT),
    ([(b"Authorization", b"Bearer ya29.gclouds-own")], Action.FORWARD),  # its own, as it came
    ([], Action.FORWARD),
    ([(b"X-Goog-Token", MARK.encode())], Action.REFUSE),
])
def test_tokeninfo_gets_the_real_token_in_place_of_the_placeholder_only(
        headers: list[tuple[bytes, bytes]], action: Action) -> None:
    assert judge(ENDPOINTS["gemini"], b"POST", b"/tokeninfo", headers, b"").action is action


@pytest.mark.parametrize(("target", "headers", "body"), [
    (b"/revoke?token=1%2F%2F" + MARK.encode(), FORM, b""),
    (b"/oauth/revoke", JSON, json.dumps({"token": "rt_" + MARK}).encode()),
    (b"/x", [(b"X-Token", MARK.encode())], b""),
    (b"/x", JSON, b'{"t": "\\u0061gent-sandbox-placeholder"}'),
    (b"/x", FORM, b"t=%2561gent-sandbox-placeholder"),
])
def test_a_placeholder_anywhere_else_on_the_host_is_refused(
        target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    got = judge(ENDPOINTS["codex"], b"POST", target, headers, body)
    assert (got.action, got.status) == (Action.REFUSE, 403)
    assert got.reason == "codex's login is held on the host: the session's placeholder gets " \
                         "nothing here"


def test_only_geminis_tokeninfo_gets_the_real_token() -> None:
    gemini = ENDPOINTS["gemini"]
    assert gemini.host == "oauth2.googleapis.com" and gemini.token_path == "/token"
    bearer = [(b"Authorization", f"Bearer ya29.{MARK}".encode())]
    assert judge(gemini, b"POST", b"/tokeninfo", bearer, b"").action is Action.INJECT
    assert judge(gemini, b"POST", b"/TokenInfo/", bearer, b"").action is Action.INJECT
    assert judge(gemini, b"GET", b"/.well-known/x", [], b"").action is Action.FORWARD
    assert judge(ENDPOINTS["claude"], b"POST", b"/tokeninfo", FORM, b"").action \
        is Action.FORWARD


def test_path_key_and_params() -> None:
    assert path_key(b"/a/%2F/b//?q") == "/a/b"
    assert path_key(b"") == "/"
    assert params([], b'{"a": 1}') == {"a": 1}
    assert params([], b"a=1&b=2") == {"a": "1", "b": "2"}
    assert params(FORM, b"a=1&a=2") is None


@pytest.mark.parametrize(("answer", "holds"), [
    (b'{"access_token": "ya29.x"}', True),
    (b'{"data": [{"Refresh-Token": "x"}]}', True),
    (b'{"accessToken": "x"}', True),
    (b"access_token=x&expires_in=3", True),
    (b'{"error": "invalid_grant", "error_description": "bad refresh_token"}', False),
    (b'{"access_token": ""}', False),
    (b'{"expires_in": 3000, "scope": "s", "email": "p@example.com"}', False),
    (b"", False),
])
def test_an_answer_holding_a_token_is_seen(answer: bytes, holds: bool) -> None:
    assert holds_tokens(answer) is holds


def _jwt(claims: dict[str, object]) -> str:
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{raw}.REALSIG"


AUTH = {"chatgpt_account_id": "acct-9", "chatgpt_plan_type": "pro"}


def test_masked_answers_keep_what_is_not_a_token() -> None:
    now = int(time.time() * 1000)
    got = {"access_token": "REAL-A", "refresh_token": "REAL-R", "expires_in": 3600,
           "scope": "user:inference", "account": {"uuid": "u"}, "id_token": "REAL-I"}
    out = placeholders.masked(CLAUDE, got, now)
    assert "REAL" not in json.dumps(out) and out["account"] == {"uuid": "u"}
    assert out["access_token"] == placeholders.ACCESS and out["scope"] == "user:inference"
    assert now + out["expires_in"] * 1000 > placeholders.FAR_AHEAD_MS - 1000
    codex = placeholders.masked(CODEX, {"access_token": _jwt({"exp": 1}),
                                        "id_token": _jwt({"https://api.openai.com/auth": AUTH}),
                                        "refresh_token": "REAL-R"}, now)
    assert "REAL" not in json.dumps(codex) and codex["refresh_token"] == placeholders.CODEX_REFRESH
    assert jwt_claims(codex["id_token"]) == {"https://api.openai.com/auth": AUTH}
    assert jwt_claims(codex["access_token"]) == {"exp": placeholders.FAR_AHEAD_MS // 1000}
    gemini = placeholders.masked(GEMINI, {"access_token": "REAL", "id_token": "REAL-I"}, now)
    assert "REAL" not in json.dumps(gemini) and gemini["refresh_token"].endswith(MARK)


def test_a_new_login_replaces_the_old_accounts_fields() -> None:
    now = int(time.time() * 1000)
    old = {"claudeAiOauth": {"accessToken": "A0", "refreshToken": "R0", "expiresAt": 1,
                             "subscriptionType": "max"}, "other": 1}
    held = oauth_login.parse(CLAUDE, json.dumps(old))[1]
    data, tokens = oauth_login.stored(CLAUDE, old, held, {
        "access_token": "A1", "refresh_token": "R1", "expires_in": 60, "scope": "a b"}, now)
    assert tokens == ("A1", "R1", now + 60000, ("a", "b"))
    assert data == {"claudeAiOauth": {"accessToken": "A1", "refreshToken": "R1",
                                      "expiresAt": now + 60000, "scopes": ["a", "b"]},
                    "other": 1}
    data, _ = oauth_login.stored(CODEX, None, None, {
        "access_token": _jwt({"exp": 2}), "refresh_token": "R1",
        "id_token": _jwt({"https://api.openai.com/auth": AUTH})}, now)
    assert data["tokens"]["account_id"] == "acct-9" and data["OPENAI_API_KEY"] is None
    with pytest.raises(LoginError, match="no usable id token"):
        oauth_login.stored(CODEX, None, None, {"access_token": "A", "refresh_token": "R"}, now)
    with pytest.raises(LoginError, match="no usable token"):
        oauth_login.stored(CLAUDE, None, None, {"refresh_token": "R1", "expires_in": 1}, now)
    with pytest.raises(LoginError, match="no usable"):  # no refresh token, none held
        oauth_login.stored(CLAUDE, None, None, {"access_token": "A", "expires_in": 1}, now)
    old = {"refresh_token": "R0", "access_token": "A0", "expiry_date": 1}
    held = oauth_login.parse(GEMINI, json.dumps(old))[1]
    data, _ = oauth_login.stored(GEMINI, old, held, {"access_token": "A1", "expires_in": 5}, now)
    assert (data["access_token"], data["refresh_token"]) == ("A1", "R0")


def test_the_secrets_file_names_a_login_and_its_token_host_becomes_an_inject_host() -> None:
    text = json.dumps([{"host": "api.anthropic.com", "header": "Authorization",
                        "command": "true", "login": "claude"},
                       {"host": "chatgpt.com", "header": "Authorization", "command": "true"}])
    secrets = parse_secrets(text, "f")
    assert [s.login for s in secrets] == ["claude", ""]
    assert login_hosts(secrets) == ("platform.claude.com",)
    from libbroker.errors import UsageError

    with pytest.raises(UsageError, match="entry 0: 'login' must be one of claude, codex, gemini"):
        parse_secrets(json.dumps([{"host": "a.example", "header": "X", "command": "c",
                                   "login": "github"}]), "f")


def keeper(kind: str, path: Path, word: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "libegress.login_keeper", kind, str(path), word]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30,
                          check=False)


def test_the_keeper_answers_a_refresh_with_placeholders_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    id_token = _jwt({"email": "p@example.com", "https://api.openai.com/auth": AUTH})
    path.write_text(json.dumps({"tokens": {"id_token": id_token, "access_token": _jwt(
        {"exp": int(time.time()) + 60}), "refresh_token": "rt_REAL", "account_id": "acct-9"}}))
    before = path.read_text()
    done = keeper("codex", path, "--answer")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "REAL" not in done.stdout and out["refresh_token"] == placeholders.CODEX_REFRESH
    assert jwt_claims(out["id_token"])["https://api.openai.com/auth"] == AUTH
    assert path.read_text() == before
    missing = keeper("codex", tmp_path / "none.json", "--answer")
    assert missing.returncode == 1
    assert missing.stderr == "login-keeper: codex's login file holds no login to answer for\n"


@pytest.mark.parametrize("exists", [True, False])
def test_the_keeper_stores_a_new_login_atomically_with_the_files_mode(
        tmp_path: Path, exists: bool) -> None:
    path = tmp_path / ".claude" / ".credentials.json"
    if exists:  # the same account (Claude Code records it in ~/.claude.json)
        path.parent.mkdir()
        (tmp_path / ".claude.json").write_text(json.dumps({"oauthAccount": {"accountUuid": "u"}}))
        path.write_text(json.dumps({"claudeAiOauth": {"accessToken": "A0", "refreshToken": "R0",
                                                      "expiresAt": 1}}))
        path.chmod(0o640)
    answer = {"access_token": "sk-ant-oat01-REAL1", "refresh_token": "sk-ant-ort01-REAL1",
              "expires_in": 28800, "scope": "user:inference", "account": {"uuid": "u"}}
    done = keeper("claude", path, "--store", json.dumps(answer))
    assert done.returncode == 0, done.stderr
    assert "REAL" not in done.stdout and json.loads(done.stdout)["account"] == {"uuid": "u"}
    held = json.loads(path.read_text())["claudeAiOauth"]
    assert (held["accessToken"], held["refreshToken"]) == ("sk-ant-oat01-REAL1",
                                                           "sk-ant-ort01-REAL1")
    assert os.stat(path).st_mode & 0o777 == (0o640 if exists else 0o600)
    assert [p.name for p in path.parent.iterdir()] == [".credentials.json"]
    if not exists:  # a first login: the agent's directory made for it, the person's only
        assert os.stat(path.parent).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("stdin", ["", "[]", "{", '{"access_token": 5}', '{"error": "x"}'])
def test_the_keeper_refuses_an_answer_with_no_login_and_leaves_the_file(
        tmp_path: Path, stdin: str) -> None:
    path = tmp_path / ".credentials.json"
    path.write_text('{"claudeAiOauth": {"accessToken": "A0", "refreshToken": "R0", '
                    '"expiresAt": 1}}')
    before = path.read_text()
    done = keeper("claude", path, "--store", stdin)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("login-keeper: the token endpoint's answer ")
    assert path.read_text() == before


def test_the_keeper_refuses_two_modes_and_unknown_words(tmp_path: Path) -> None:
    for extra in (["--answer", "--store"], ["--steal"]):
        argv = [sys.executable, "-m", "libegress.login_keeper", "claude", str(tmp_path / "f"),
                *extra]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 2 and done.stderr.startswith("usage:")
