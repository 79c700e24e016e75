"""A new login made inside a session is kept on the host: both backends, the real CLIs.

The person's host holds a login (the session's copy holds placeholders); inside,
a new login's authorization code is exchanged at the agent's token endpoint.
egress-proxy sends the exchange upstream (the stand-in issues a new pair for its
one code), the host-side keeper writes the new pair to the person's own login
file (atomically, its mode kept) and the session gets placeholders; the
proxy's secrets read the new access token at once, so the agent's next turn
goes with it.  No real token of either login is found inside.

- Codex under bwrap: the real ``codex login`` (its browser flow, driven by
  fetching its localhost callback with the stand-in's code and the state it
  printed; it then asks for an API key with a token exchange, which egress-proxy
  refuses, and Codex goes on without one);
- Codex under Landlock, where a session may not listen (``codex login`` stops
  with "Permission denied"), and Claude Code and Gemini CLI, whose ``/login``
  needs a browser and a terminal: curl sends the exact exchange each sends
  (read in the installed CLIs: Claude Code's JSON with ``state``; Codex's
  form; Gemini CLI's form, as google-auth-library sends it, with the installed
  app's public secret).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
import test_claude_login_e2e as claude_login
import test_codex_login_e2e as codex_login
import test_gemini_login_e2e as gemini_login
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import CLIENT_ID, CODEX_CLIENT_ID, GEMINI_CLIENT_ID, Oauth, serving

BACKENDS = ("bwrap", "nono")
MARK = "agent-sandbox-placeholder"
LEARN = "import json\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))]\n"


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    with serving(tmp_path) as found:
        yield found


EXCHANGE = {
    "claude": ("https://platform.claude.com/v1/oauth/token", "application/json",
               json.dumps({"grant_type": "authorization_code", "code": "{code}",
                           "redirect_uri": "http://localhost:45454/callback",
                           "client_id": CLIENT_ID, "code_verifier": "v" * 43, "state": "s"})),
    # Codex's own exchange (its login server's form), for Landlock, where it may not listen
    "codex": ("https://auth.openai.com/oauth/token", "application/x-www-form-urlencoded",
              "grant_type=authorization_code&code={code}&redirect_uri=http%3A%2F%2F127.0.0.1"
              f"%3A1455%2Fauth%2Fcallback&client_id={CODEX_CLIENT_ID}&code_verifier={'v' * 43}"),
    "gemini": ("https://oauth2.googleapis.com/token",
               "application/x-www-form-urlencoded;charset=UTF-8",
               f"client_id={GEMINI_CLIENT_ID}&code_verifier={'v' * 43}&code={{code}}"
               "&grant_type=authorization_code&redirect_uri=http%3A%2F%2F127.0.0.1%3A45454"
               "%2Foauth2callback&client_secret=GOCSPX-x"),
}
TURN = {"claude": "claude -p hello", "gemini": "gemini --skip-trust -p hello",
        "codex": "codex exec --skip-git-repo-check hello"}

CURL = """
curl -sS -X POST -H 'Content-Type: {ctype}' {url} --data-binary '{body}' > answer.json || exit 1
echo "ANSWER $(cat answer.json)"
i=0; while [ ! -e refreshed ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
{turn} || exit 1
python3 scan.py
"""

# codex login prints its authorization URL (with the state) and waits on
# 127.0.0.1:1455 for the browser's redirect: the redirect is fetched here.
CODEX_LOGIN = """
timeout 60 codex login > login.out 2>&1 &
i=0; while ! grep -q 'state=' login.out && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
state=$(grep -o 'state=[^&]*' login.out | head -1 | cut -d= -f2)
curl -sSL -m 60 --noproxy "*" -o callback.out "http://127.0.0.1:1455/auth/callback?code={code}&state=$state"
wait $! || {{ cat login.out callback.out; exit 1; }}
cat login.out
echo "ANSWER $(python3 -c 'import json, os
print(json.dumps(json.load(open(os.environ["CODEX_HOME"] + "/auth.json"))))')"
{turn} || exit 1
python3 scan.py
"""


def _login(agent: str, w: Home, o: Oauth) -> Path:
    module = {"claude": claude_login, "codex": codex_login, "gemini": gemini_login}[agent]
    return module.login(w, o, 8 * 3600)


def _run(agent: str, w: Home, o: Oauth, backend: str,
         script: str) -> subprocess.CompletedProcess[str]:
    module = {"claude": claude_login, "codex": codex_login, "gemini": gemini_login}[agent]
    return module.run(w, o, backend, script)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_login_made_inside_is_kept_on_the_host_and_the_session_gets_placeholders(
    world: Home, oauth: Oauth, agent: str, backend: str
) -> None:
    need(agent)
    w, o = world, oauth
    w.gemini_relaunch = True  # Gemini CLI's real relaunch, a login inside (agents_world.py)
    path = _login(agent, w, o)
    old = [*o.secrets(), *([o.id_token] if agent == "codex" else [])]
    mode = path.stat().st_mode & 0o777
    flag = w.workdir / "refreshed"  # the new pair, learnt by the scan inside
    o.on_refresh = lambda: flag.write_text(json.dumps(split(
        *o.issued[-1], *([o.id_token] if agent == "codex" else []))))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*old)))
    if agent == "codex" and backend == "bwrap":
        script = CODEX_LOGIN.format(code=o.code, turn=TURN[agent])
    else:
        url, ctype, body = EXCHANGE[agent]
        script = CURL.format(url=url, ctype=ctype, body=body.replace("{code}", o.code),
                             turn=TURN[agent])
    done = _run(agent, w, o, backend, script)
    out = done.stdout
    report(f"oauth {agent} {backend} login-inside", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "pong" in out and "SCANNED" in out and "FOUND" not in out, out + done.stderr[-2000:]
    # The new pair is the person's, in their own file, with its mode.
    new_access, new_refresh = o.issued[-1]
    assert new_access not in old and new_refresh not in old
    held = json.loads(path.read_text())
    text = json.dumps(held)
    assert new_access in text and new_refresh in text, held
    assert path.stat().st_mode & 0o777 == mode
    assert not [p for p in path.parent.iterdir() if ".keeper-" in p.name]
    # The session got placeholders only.
    answer = out.split("ANSWER ", 1)[1].splitlines()[0]
    assert MARK in answer and not any(t and t in answer for t in (*o.secrets(), o.id_token)), answer
    # One exchange reached the token endpoint, with the code and no placeholder; the turn
    # after it went with the new access token.
    (exchange,) = [r for r in o.refreshes() if "authorization_code" in r.body]
    assert o.code.startswith("spent-") and MARK not in exchange.headers + unquote(exchange.body)
    last = [r for r in o.seen if r.path.endswith(("/v1/messages", "/codex/responses"))
            or r.path.startswith("/v1internal:streamGenerateContent")][-1]
    assert f"Bearer {new_access}" in last.headers, done.stderr[-3000:]
    assert (f"{agent}'s new login (a code exchanged inside the session) is kept in the "
            "person's login file; the session holds placeholders") in done.stderr
