"""A first login made inside a session whose host had none, and a login for another account.

The host holds no login file for the agent at the start: the session runs the
agent, so egress-proxy serves its token host all the same.  Inside, a new
login's authorization code is exchanged (Codex under bwrap: the real ``codex
login``; otherwise curl sends the exact exchange the CLI sends, and writes the
answer to the agent's login file as the CLI would; Claude Code and Gemini CLI,
whose ``/login`` needs a browser and a terminal).  The keeper creates the
person's login file (0600, its directory 0700 when there was none, the agent's
own format), the session gets placeholders, the next turn goes with the new
real token, and no real token is found inside.  The keeper, with no login to
hold before that, says nothing.

Then a host that holds Claude's login for one account, and a login made inside
for another: refused with its line (403 to the session, one log line), the
host's file unchanged byte for byte, neither login's tokens inside; with
``unsafe_login_switch = true`` the other account's login is kept.

(A credential of the session's own beside a held login: in the Google login's
session, test_gemini_login_e2e.py.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_claude_login_e2e as claude_login
import test_codex_login_e2e as codex_login
import test_gemini_login_e2e as gemini_login
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import Oauth, run_logged_in, serving
from test_login_inside_e2e import CODEX_LOGIN, EXCHANGE, LEARN, TURN

BACKENDS = ("bwrap", "nono")
MARK = "agent-sandbox-placeholder"
KEY_VAR = {"claude": "ANTHROPIC_API_KEY", "codex": "OPENAI_API_KEY",
           "gemini": "GEMINI_API_KEY"}

# The agent's login file as each CLI writes it from the token answer (placeholders here).
WRITE = {
    "claude": """import json, os, time
a = json.load(open("answer.json"))
with open(os.path.join(os.environ["CLAUDE_CONFIG_DIR"], ".credentials.json"), "w") as fh:
    json.dump({"claudeAiOauth": {"accessToken": a["access_token"],
        "refreshToken": a["refresh_token"],
        "expiresAt": int(time.time() * 1000) + a["expires_in"] * 1000,
        "scopes": a.get("scope", "").split(), "subscriptionType": "max"}}, fh)
""",
    "codex": """import base64, json, os
a = json.load(open("answer.json"))
claims = json.loads(base64.urlsafe_b64decode(a["id_token"].split(".")[1] + "=="))
account = claims["https://api.openai.com/auth"]["chatgpt_account_id"]
with open(os.path.join(os.environ["CODEX_HOME"], "auth.json"), "w") as fh:
    json.dump({"OPENAI_API_KEY": None, "tokens": {"id_token": a["id_token"],
        "access_token": a["access_token"], "refresh_token": a["refresh_token"],
        "account_id": account}, "last_refresh": "2026-01-01T00:00:00Z"}, fh)
""",
    "gemini": """import json, os, time
a = json.load(open("answer.json"))
with open(os.path.join(os.environ["GEMINI_CLI_HOME"], ".gemini", "oauth_creds.json"), "w") as fh:
    json.dump({"access_token": a["access_token"], "refresh_token": a["refresh_token"],
        "scope": a.get("scope", ""), "token_type": "Bearer",
        "expiry_date": int(time.time() * 1000) + a["expires_in"] * 1000}, fh)
""",
}

CURL = """
curl -sS -X POST -H 'Content-Type: {ctype}' {url} --data-binary '{body}' > answer.json || exit 1
echo "ANSWER $(cat answer.json)"
python3 write_login.py || exit 1
i=0; while [ ! -e refreshed ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
{turn} || exit 1
python3 scan.py
"""


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    with serving(tmp_path) as found:
        yield found


def _no_login(agent: str, w: Home, o: Oauth) -> Path:
    """The stand-in set up for ``agent``, the host with no login file (nor its directory)."""
    module = {"claude": claude_login, "codex": codex_login, "gemini": gemini_login}[agent]
    path: Path = module.login(w, o, 8 * 3600)
    path.unlink()  # the agent's directory stays: its config is there (the world's)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agent", ["codex", "claude", "gemini"])
def test_a_first_login_inside_is_kept_on_the_host_and_the_session_gets_placeholders(
    world: Home, oauth: Oauth, agent: str, backend: str
) -> None:
    need(agent)
    w, o = world, oauth
    path = _no_login(agent, w, o)
    assert not path.exists()
    flag = w.workdir / "refreshed"  # the new pair, learnt by the scan inside
    o.on_refresh = lambda: flag.write_text(json.dumps(split(
        *o.issued[-1], *([o.id_token] if agent == "codex" else []))))
    # (a value made now: a literal would be found in this file, wherever the checkout is
    # readable inside, e.g. a clone under /tmp)
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(os.urandom(8).hex())))
    (w.workdir / "write_login.py").write_text(WRITE[agent])
    if agent == "codex" and backend == "bwrap":
        script = CODEX_LOGIN.format(code=o.code, turn=TURN[agent])
    else:
        url, ctype, body = EXCHANGE[agent]
        script = CURL.format(url=url, ctype=ctype, body=body.replace("{code}", o.code),
                             turn=TURN[agent])
    done = run_logged_in(w, o, backend, agent, KEY_VAR[agent], script, timeout=180)
    out = done.stdout
    report(f"oauth {agent} {backend} first-login-inside", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "pong" in out and "SCANNED" in out and "FOUND" not in out, out + done.stderr[-2000:]
    # The person's new file holds the real pair, 0600, in the agent's own format.
    new_access, new_refresh = o.issued[-1]
    held = json.loads(path.read_text())
    if agent == "gemini":
        assert (held["access_token"], held["refresh_token"]) == (new_access, new_refresh)
        assert held["expiry_date"] > 0 and held["id_token"]
    elif agent == "codex":
        assert held["tokens"]["access_token"] == new_access
        assert held["tokens"]["refresh_token"] == new_refresh
        assert held["tokens"]["id_token"] == o.id_token and held["OPENAI_API_KEY"] is None
    else:
        inner = held["claudeAiOauth"]
        assert (inner["accessToken"], inner["refreshToken"]) == (new_access, new_refresh)
        assert inner["expiresAt"] > 0 and inner["scopes"]
    assert path.stat().st_mode & 0o777 == 0o600
    # The session got placeholders only; the turn after went with the new real token.
    answer = out.split("ANSWER ", 1)[1].splitlines()[0]
    assert MARK in answer and not any(t and t in answer for t in (*o.secrets(), o.id_token))
    last = [r for r in o.seen if r.path.endswith(("/v1/messages", "/codex/responses"))
            or r.path.startswith("/v1internal:streamGenerateContent")][-1]
    assert f"Bearer {new_access}" in last.headers, done.stderr[-3000:]
    assert (f"{agent}'s new login (a code exchanged inside the session) is kept in the "
            "person's login file; the session holds placeholders") in done.stderr
    # No login at the start: the keeper held nothing and said nothing.
    assert "token renewal failed" not in done.stderr, done.stderr[-3000:]
    assert "login stays on this host" not in done.stderr


SWITCH = """
curl -sS -X POST -H 'Content-Type: {ctype}' {url} --data-binary '{body}' -D head.txt \
  > answer.txt || exit 1
echo "STATUS $(grep "^HTTP" head.txt | tail -1)"
echo "ANSWER $(cat answer.txt)"
i=0; while [ ! -e refreshed ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
python3 scan.py
"""


@pytest.mark.parametrize("opted_in", [False, True])
def test_a_login_inside_for_another_account_is_refused_unless_opted_in(
    world: Home, oauth: Oauth, opted_in: bool
) -> None:
    need("claude")
    w, o = world, oauth
    path = claude_login.login(w, o, 8 * 3600)
    before = path.read_bytes()
    first = o.secrets()
    o.account = "claude-account-someone-else"  # the code is for another account
    flag = w.workdir / "refreshed"
    o.on_refresh = lambda: flag.write_text(json.dumps(split(*o.issued[-1])))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    url, ctype, body = EXCHANGE["claude"]
    script = SWITCH.format(url=url, ctype=ctype, body=body.replace("{code}", o.code))
    keys = {"unsafe_login_switch": True} if opted_in else {}
    done = run_logged_in(w, o, "bwrap", "claude", "ANTHROPIC_API_KEY", script, timeout=150,
                         **keys)
    out = done.stdout
    report(f"oauth claude bwrap other-account{'-opted-in' if opted_in else ''}", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "SCANNED" in out and "FOUND" not in out, out
    assert len(o.issued) == 2  # the exchange reached the endpoint: the new pair exists
    new_access, new_refresh = o.issued[-1]
    reason = ("claude's new login is for another account than the one logged in on the host: "
              "not kept (unsafe_login_switch = true lets a login made inside replace it)")
    if opted_in:
        assert "STATUS HTTP/1.1 200" in out and MARK in out
        held = json.loads(path.read_text())["claudeAiOauth"]
        assert (held["accessToken"], held["refreshToken"]) == (new_access, new_refresh)
        assert reason not in done.stderr
    else:
        assert "STATUS HTTP/1.1 403" in out, out
        assert f"ANSWER egress-proxy: {reason}" in out, out
        assert path.read_bytes() == before  # the host's login, unchanged
        assert done.stderr.count(reason) == 1, done.stderr[-3000:]
    assert new_access not in out and new_refresh not in out
    assert not [p for p in path.parent.iterdir() if ".keeper-" in p.name]
