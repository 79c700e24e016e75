"""libegress.login_keeper, the real command, against a stand-in token endpoint (TLS, pinned).

It prints the login's access token; when the token is due it refreshes it and
writes the rotated pair back (atomically, the file's mode kept); a refresh
that fails keeps a still-valid token; every refusal is one line on stderr
that holds no token.  oauth_login's answers are checked case by case.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))

from standin_oauth import CLIENT_ID, Oauth, start

from libegress import oauth_login
from libegress.oauth_login import CLAUDE, LoginError

MARGIN_S = oauth_login.MARGIN_MS // 1000


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    found, server = start(tmp_path)
    yield found
    server.shutdown()
    server.server_close()


def write_login(path: Path, o: Oauth, expires_in_s: float, mode: int = 0o640) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"claudeAiOauth": {
        "accessToken": o.access, "refreshToken": o.refresh,
        "expiresAt": int((time.time() + expires_in_s) * 1000),
        "scopes": ["user:inference", "user:profile"], "subscriptionType": "pro"},
        "other": {"kept": True}}))
    path.chmod(mode)
    return path


def keeper(o: Oauth, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "libegress.login_keeper", "claude", str(path),
            f"--resolve=platform.claude.com:127.0.0.1:{o.port}", f"--ca={o.ca_file}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def no_token_in(text: str, o: Oauth) -> bool:
    return not any(t in text for t in o.secrets())


def test_a_token_not_due_is_printed_and_nothing_is_asked(oauth: Oauth, tmp_path: Path) -> None:
    path = write_login(tmp_path / "c" / ".credentials.json", oauth, 3600)
    before = path.read_text()
    done = keeper(oauth, path)
    assert (done.returncode, done.stdout, done.stderr) == (0, oauth.access + "\n", "")
    assert oauth.seen == [] and path.read_text() == before


def test_a_due_token_is_refreshed_and_the_rotated_pair_written_back(
    oauth: Oauth, tmp_path: Path
) -> None:
    first = (oauth.access, oauth.refresh)
    path = write_login(tmp_path / "c" / ".credentials.json", oauth, MARGIN_S - 1)
    done = keeper(oauth, path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == oauth.access + "\n" and oauth.access != first[0]
    (asked,) = oauth.refreshes()
    body = json.loads(asked.body)
    assert body == {"grant_type": "refresh_token", "refresh_token": first[1],
                    "client_id": CLIENT_ID, "scope": "user:inference user:profile"}
    data = json.loads(path.read_text())
    login = data["claudeAiOauth"]
    assert (login["accessToken"], login["refreshToken"]) == (oauth.access, oauth.refresh)
    assert login["expiresAt"] > (time.time() + 28000) * 1000
    assert login["subscriptionType"] == "pro" and data["other"] == {"kept": True}
    assert path.stat().st_mode & 0o7777 == 0o640
    assert sorted(p.name for p in path.parent.iterdir()) == [".credentials.json"]
    # The next run finds it fresh: no second refresh.
    assert keeper(oauth, path).stdout == oauth.access + "\n" and len(oauth.refreshes()) == 1


def test_a_failed_refresh_keeps_a_still_valid_token(oauth: Oauth, tmp_path: Path) -> None:
    path = write_login(tmp_path / "c" / ".credentials.json", oauth, 60)
    oauth.refresh = "revoked-elsewhere"  # the endpoint no longer knows the file's token
    before = path.read_text()
    done = keeper(oauth, path)
    assert done.returncode == 0 and done.stdout == json.loads(before)["claudeAiOauth"][
        "accessToken"] + "\n"
    assert done.stderr == ("login-keeper: the refresh failed (the token endpoint answered "
                           "400); the held token is still valid\n")
    assert path.read_text() == before


def test_an_expired_token_whose_refresh_fails_is_refused(oauth: Oauth, tmp_path: Path) -> None:
    path = write_login(tmp_path / "c" / ".credentials.json", oauth, -10)
    oauth.refresh = "revoked-elsewhere"
    done = keeper(oauth, path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("login-keeper: the refresh failed (the token endpoint answered 400) "
                           "and the access token has expired\n")


def test_an_unreachable_endpoint_is_said_without_a_token(oauth: Oauth, tmp_path: Path) -> None:
    path = write_login(tmp_path / "c" / ".credentials.json", oauth, -10)
    argv = [sys.executable, "-m", "libegress.login_keeper", "claude", str(path),
            "--resolve=platform.claude.com:127.0.0.1:1", f"--ca={oauth.ca_file}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "ConnectionRefusedError" in done.stderr
    assert no_token_in(done.stderr, oauth)


@pytest.mark.parametrize(("content", "said"), [
    ("not json", "claude's login file is not JSON"),
    ('{"claudeAiOauth": 1}', "claude's login file holds no claudeAiOauth"),
    ('{"claudeAiOauth": {"accessToken": "a b", "refreshToken": "r", "expiresAt": 1}}',
     "claude's login has no usable access and refresh token"),
    ('{"claudeAiOauth": {"accessToken": "a", "refreshToken": "r"}}',
     "claude's login has no expiry"),
])
def test_a_bad_login_file_is_one_line(
    oauth: Oauth, tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "c" / ".credentials.json"
    path.parent.mkdir()
    path.write_text(content)
    done = keeper(oauth, path)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"login-keeper: {said}\n")


def test_a_missing_file_a_link_and_bad_usage(oauth: Oauth, tmp_path: Path) -> None:
    done = keeper(oauth, tmp_path / "none.json")  # no login yet: nothing held, nothing said
    assert (done.returncode, done.stdout, done.stderr) == (3, "", "")
    real = write_login(tmp_path / "real.json", oauth, 3600)
    (tmp_path / "link.json").symlink_to(real)
    done = keeper(oauth, tmp_path / "link.json")  # the person's file, never through a link
    assert done.returncode == 1 and done.stdout == ""
    done = subprocess.run([sys.executable, "-m", "libegress.login_keeper", "aider", "x"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and done.stderr.startswith("usage: ")


TOKENS = oauth_login.Tokens("a1", "r1", 0, ("user:inference",))
DATA = {"claudeAiOauth": {"accessToken": "a1", "refreshToken": "r1", "expiresAt": 0}}


@pytest.mark.parametrize(("status", "answer", "said"), [
    (401, b"{}", "the token endpoint answered 401"),
    (200, b"nope", "the token endpoint's answer is not JSON"),
    (200, b"[]", "the token endpoint's answer is not an object"),
    (200, b'{"expires_in": 60}', "the token endpoint's answer holds no usable token"),
    (200, b'{"access_token": "a\\r\\nX-Evil: 1", "expires_in": 60}',
     "the token endpoint's answer holds no usable token"),
    (200, b'{"access_token": "a2", "refresh_token": "r 2", "expires_in": 60}',
     "the token endpoint's answer holds no usable token"),
    (200, b'{"access_token": "a2", "expires_in": 0}',
     "the token endpoint's answer has no usable expires_in"),
    (200, b'{"access_token": "a2", "expires_in": true}',
     "the token endpoint's answer has no usable expires_in"),
])
def test_a_token_answer_that_cannot_be_used_is_refused(
    status: int, answer: bytes, said: str
) -> None:
    with pytest.raises(LoginError) as err:
        oauth_login.refreshed(CLAUDE, DATA, TOKENS, status, answer, 1000)
    assert str(err.value) == said


def test_an_answer_without_a_refresh_token_keeps_the_old_one() -> None:
    data, tokens = oauth_login.refreshed(CLAUDE, DATA, TOKENS, 200,
                                         b'{"access_token": "a2", "expires_in": 60}', 1000)
    assert tokens == oauth_login.Tokens("a2", "r1", 61000, ())
    assert data["claudeAiOauth"] == {"accessToken": "a2", "refreshToken": "r1",
                                     "expiresAt": 61000}
    assert DATA["claudeAiOauth"]["accessToken"] == "a1"  # the input is not changed


def test_a_due_codex_login_is_refreshed_by_its_jwt_expiry(oauth: Oauth, tmp_path: Path) -> None:
    oauth.codex(MARGIN_S - 1)  # the access token's exp claim says it is due
    first = (oauth.id_token, oauth.access, oauth.refresh)
    path = tmp_path / "codex" / "auth.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": {
        "id_token": first[0], "access_token": first[1], "refresh_token": first[2],
        "account_id": "acct-standin-1"}, "last_refresh": "2026-01-01T00:00:00Z"}))
    path.chmod(0o600)
    argv = [sys.executable, "-m", "libegress.login_keeper", "codex", str(path),
            f"--resolve=auth.openai.com:127.0.0.1:{oauth.port}", f"--ca={oauth.ca_file}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, oauth.access + "\n"), done.stderr
    (asked,) = oauth.refreshes()
    assert json.loads(asked.body) == {"grant_type": "refresh_token", "refresh_token": first[2],
                                      "client_id": "app_EMoamEEZ73f0CkXaXp7hrann"}
    data = json.loads(path.read_text())
    assert data["tokens"] == {"id_token": oauth.id_token, "access_token": oauth.access,
                              "refresh_token": oauth.refresh, "account_id": "acct-standin-1"}
    assert data["last_refresh"] > "2026-01-01T00:00:00Z"
    assert path.stat().st_mode & 0o7777 == 0o600
    # Not due now (the new access token's exp is hours ahead): no second refresh.
    again = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert again.stdout == oauth.access + "\n" and len(oauth.refreshes()) == 1


def test_a_due_google_login_is_refreshed_with_a_form_and_keeps_its_refresh_token(
    oauth: Oauth, tmp_path: Path
) -> None:
    oauth.gemini()
    first = (oauth.access, oauth.refresh)
    path = tmp_path / "g" / "oauth_creds.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"access_token": first[0], "refresh_token": first[1],
                                "scope": "s", "token_type": "Bearer", "id_token": "x.y.z",
                                "expiry_date": int((time.time() + 60) * 1000)}))
    argv = [sys.executable, "-m", "libegress.login_keeper", "gemini", str(path),
            f"--resolve=oauth2.googleapis.com:127.0.0.1:{oauth.port}", f"--ca={oauth.ca_file}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, oauth.access + "\n"), done.stderr
    (asked,) = oauth.refreshes()
    assert "content-type: application/x-www-form-urlencoded" in asked.headers.lower()
    data = json.loads(path.read_text())
    assert (data["access_token"], data["refresh_token"]) == (oauth.access, first[1])
    assert data["expiry_date"] > (time.time() + 28000) * 1000 and data["id_token"] == "x.y.z"
