"""A process inside a logged-in session asks the agent's token endpoint, then the
real CLI is forced to refresh inside: the script, and what its output must show.

:func:`script` (``sh``, run by ``run_logged_in``): with curl, as the CLI itself
sends it (read in the installed CLIs), a refresh with the session's refresh
token (the placeholder), one with a refresh token of another login, and
another grant carrying the placeholder; each prints ``NAME STATUS BODY
X-Proxy-Error``.  Then the copy's login is made to expire (the CLI refreshes
before its next call), the agent takes a turn, the copy's login is printed
(``HELD``) and the scan runs.  :func:`check` asserts the lot.

The login tests run the script after their own turns in the same session (one
session per agent and backend proves the host's refresh and the refresh inside):
``host_refreshes`` says how many refreshes the host made before it.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple

from standin_oauth import CLIENT_ID, CODEX_CLIENT_ID, GCLOUD_CLIENT_ID, GEMINI_CLIENT_ID, Oauth

MARK = "agent-sandbox-placeholder"


class Agent(NamedTuple):
    url: str
    ctype: str
    file: str  # the copy's login file, inside
    refresh: str  # Python: the refresh token in `d`
    body: str  # the refresh request, {R} for the refresh token
    expire: str  # Python: `d` made to expire
    turn: str


AGENTS = {
    "claude": Agent(
        "https://platform.claude.com/v1/oauth/token", "application/json",
        '"$CLAUDE_CONFIG_DIR"/.credentials.json', 'd["claudeAiOauth"]["refreshToken"]',
        json.dumps({"grant_type": "{G}", "refresh_token": "{R}", "client_id": CLIENT_ID,
                    "scope": "user:inference user:profile"}),
        'd["claudeAiOauth"]["expiresAt"] = 1000', "claude -p hello"),
    "codex": Agent(
        "https://auth.openai.com/oauth/token", "application/json", '"$CODEX_HOME"/auth.json',
        'd["tokens"]["refresh_token"]',
        json.dumps({"client_id": CODEX_CLIENT_ID, "grant_type": "{G}", "refresh_token": "{R}"}),
        # the access token's exp in the past (its other claims kept), the last refresh long ago
        'h, c, s = d["tokens"]["access_token"].split("."); '
        'c = json.loads(base64.urlsafe_b64decode(c + "==")); c["exp"] = 1000; '
        'd["tokens"]["access_token"] = ".".join([h, base64.urlsafe_b64encode('
        'json.dumps(c).encode()).decode().rstrip("="), s]); '
        'd["last_refresh"] = "2020-01-01T00:00:00Z"',
        "codex exec --skip-git-repo-check hello"),
    "gemini": Agent(
        "https://oauth2.googleapis.com/token", "application/x-www-form-urlencoded",
        '"$GEMINI_CLI_HOME"/.gemini/oauth_creds.json', 'd["refresh_token"]',
        f"refresh_token={{R}}&client_id={GEMINI_CLIENT_ID}&client_secret=GOCSPX-x"
        "&grant_type={G}",
        'd["expiry_date"] = 1000', "gemini --skip-trust -p hello"),
}

_SCRIPT = r"""
F={file}
read() {{ python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print($1)" "$F"; }}
ask() {{
  code=$(curl -sS -o ans -D head -w '%{{http_code}}' -X POST -H 'Content-Type: {ctype}' \
    {url} --data-binary "$2")
  echo "$1 $code $(tr -d '\n' < ans) $(grep -i '^x-proxy-error' head | tr -d '\r')"
}}
R=$(read '{refresh}')
ask ANSWER '{held}'
ask OTHER '{other}'
ask GRANT '{grant}'
python3 -c "import base64, json, sys; d = json.load(open(sys.argv[1])); {expire}; \
json.dump(d, open(sys.argv[1], 'w'))" "$F"
{turn} > turn.out 2>&1 || {{ cat turn.out; exit 1; }}
cat turn.out
echo "HELD $(read 'json.dumps(d)')"
python3 scan.py
"""


def script(agent: str) -> str:
    a = AGENTS[agent]

    def body(grant: str, token: str) -> str:
        return a.body.replace("{G}", grant).replace("{R}", token)

    return _SCRIPT.format(
        file=a.file, ctype=a.ctype, url=a.url, refresh=a.refresh, expire=a.expire, turn=a.turn,
        held=body("refresh_token", "'$R'"), other=body("refresh_token", "other-refresh-token"),
        grant=body("password", "'$R'"))


def lines(out: str) -> dict[str, str]:
    """The script's marked lines, by their first word."""
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()
            if line.split(" ", 1)[0] in ("ANSWER", "OTHER", "GRANT", "HELD")}


def check(agent: str, o: Oauth, out: str, host_refreshes: int = 0) -> None:
    """The proxy answered the placeholder with placeholders, refused the rest with
    one reason each, the CLI refreshed inside and took its turn, nothing real
    reached the session, and nothing from inside reached the real token endpoint
    (only the host's own ``host_refreshes`` refreshes did)."""
    got = lines(out)
    status, answer = got["ANSWER"].split(" ", 1)
    token = json.loads(answer.rsplit("}", 1)[0] + "}")
    assert status == "200", got
    assert all(MARK in token[f] for f in ("access_token", "refresh_token")), token
    assert token["expires_in"] > 50 * 365 * 86400
    if agent == "codex":
        assert token["id_token"].endswith("." + MARK)
    reason = (f"egress-proxy: {agent}'s login is held on the host: only the session's "
              "placeholder refresh token is answered X-Proxy-Error: blocked-login")
    assert got["OTHER"] == f"403 {reason}", got
    assert got["GRANT"] == (f"403 egress-proxy: {agent}'s login is held on the host: grant "
                            "'password' is not answered for the session X-Proxy-Error: "
                            "blocked-login"), got
    held = json.loads(got["HELD"])
    far = time.time() + 50 * 365 * 86400
    if agent == "claude":
        login = held["claudeAiOauth"]
        assert MARK in login["accessToken"] and login["expiresAt"] > far * 1000, held
    elif agent == "codex":
        claims = held["tokens"]["access_token"].split(".")[1]
        import base64

        exp = json.loads(base64.urlsafe_b64decode(claims + "=="))["exp"]
        assert exp > far and held["tokens"]["refresh_token"].endswith(MARK), held
    else:
        assert MARK in held["access_token"] and held["expiry_date"] > far * 1000, held
    assert "pong" in out and "SCANNED" in out and "FOUND" not in out, out
    agents = [r for r in o.refreshes() if GCLOUD_CLIENT_ID not in r.body]  # not gcloud's own
    assert len(agents) == host_refreshes, agents
    assert not any(MARK in r.headers + r.body for r in o.seen)
