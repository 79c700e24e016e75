"""Claude Code's subscription login stays on the host: the real CLI, both backends.

The home holds a Claude.ai OAuth login (``.credentials.json``) issued by a
stand-in token endpoint and API (standin_oauth.py, TLS on loopback, reached
through the config's ``resolve`` pins).  No ``[[secret]]``, no API key: the
launcher sees the login by itself (libbroker.launcher.logins).

- A turn completes; the access token comes due mid-session (the person's file
  says so: standin_oauth.comes_due; the stand-in revokes the old pair when it
  rotates), it is refreshed on the host, and the next turn works with the new
  one;
- the rotated pair is in the person's file after the session, with its mode;
- the real tokens are nowhere inside (a scan of /proc, HOME, the config copy,
  the workdir and /tmp, which learns the rotated pair at run time), and no
  request but the host's refresh carries the refresh token;
- then, in the same session, a process inside posting the placeholder refresh
  token to the token endpoint gets placeholders from egress-proxy, anything
  else there is refused, and Claude Code forced to refresh inside goes on
  working; the login is untouched (inside_token.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import inside_token
import pytest
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import CLAUDE_ACCOUNT, Oauth, comes_due, run_logged_in, serving

BACKENDS = ("bwrap", "nono")
MARGIN_S = 300  # libegress.oauth_login.MARGIN_MS
PLACEHOLDER = "agent-sandbox-placeholder"


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    with serving(tmp_path) as found:
        yield found


def login(w: Home, o: Oauth, expires_in_s: float) -> Path:
    creds = w.home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {
        "accessToken": o.access, "refreshToken": o.refresh,
        "expiresAt": int((time.time() + expires_in_s) * 1000),
        "scopes": ["user:inference", "user:profile"], "subscriptionType": "max"}}))
    creds.chmod(0o640)  # not the 0600 a fresh file would get: kept as it is
    config = w.home / ".claude.json"  # Claude Code records the login's account here
    config.write_text(json.dumps({**json.loads(config.read_text()), "oauthAccount": {
        "accountUuid": CLAUDE_ACCOUNT, "emailAddress": "p@example.com"}}))
    return creds


def run(w: Home, o: Oauth, backend: str, script: str) -> subprocess.CompletedProcess[str]:
    return run_logged_in(w, o, backend, "claude", "ANTHROPIC_API_KEY", script, timeout=150)


# One session per backend proves both refreshes (a session costs the servers' start
# and Claude Code's): first the refresh from inside (inside_token.py: its turn is the
# one with the first token), then the host's login comes due (``due``: comes_due), and
# the next turn, with the refreshed token, runs the scan.
AFTER = """
touch due
i=0; while [ ! -e refreshed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e refreshed ] || { echo NO-REFRESH; exit 1; }
claude -p --allowedTools=Bash 'RUN<<python3 scan.py>>'
"""
# (the scan of the part before the host's refresh learns nothing yet)
LEARN = ("import json, os\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))] "
         "if os.path.exists('refreshed') else []\n")


def _due_now(data: dict[str, object]) -> None:
    """The login expires within the keeper's margin (a minute inside it)."""
    login = data["claudeAiOauth"]
    assert isinstance(login, dict)
    login["expiresAt"] = int((time.time() + MARGIN_S - 60) * 1000)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subscription_login_works_refreshes_on_the_host_and_stays_outside(
    world: Home, oauth: Oauth, backend: str
) -> None:
    """And a refresh from inside: curl posts the placeholder refresh token to
    platform.claude.com (served by egress-proxy): placeholders come back; another
    refresh token or grant is refused with one line; Claude Code, its copy's login
    expired, refreshes inside and takes its turn with the host's token; nothing real
    is found inside; the person's file holds the host's refresh only."""
    need("claude")
    w, o = world, oauth
    first = o.secrets()
    creds = login(w, o, 8 * 3600)
    flag = w.workdir / "refreshed"  # the session waits for it, and learns the new pair
    o.on_refresh = lambda: flag.write_text(json.dumps(split(*o.secrets())))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    due = comes_due(w.workdir / "due", creds, _due_now)
    done = run(w, o, backend, inside_token.script("claude") + AFTER)
    due.join(timeout=10)
    out = done.stdout
    report(f"oauth claude {backend} refresh-inside+host-refresh+turn", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    after = out.split("HELD ", 1)[-1]  # the inside part's scan, then the last turn's
    assert "pong" in out and after.count("SCANNED") >= 2 and "RESULT<<" in after, out
    assert "FOUND" not in out, out
    assert ("agent-sandbox: claude's login stays on this host: egress-proxy sends its token "
            "to api.anthropic.com and refreshes it (the session holds placeholders)"
            in done.stderr)
    # Refreshed once, on the host, with the first refresh token; rotated into the file
    # (the refresh inside changed neither the file nor the real pair).
    (refresh,) = o.refreshes()
    assert json.loads(refresh.body)["refresh_token"] == first[1]
    held = json.loads(creds.read_text())["claudeAiOauth"]
    assert (held["accessToken"], held["refreshToken"]) == (o.access, o.refresh) != tuple(first)
    assert held["subscriptionType"] == "max" and held["expiresAt"] > time.time() * 1000 + 3600e3
    assert creds.stat().st_mode & 0o777 == 0o640
    # The real tokens went only where they belong; no placeholder reached the service.
    for r in o.seen:
        carried = [t for t in o.secrets() if t in r.headers + r.body]
        if r.path == "/v1/oauth/token":
            assert carried == [first[1]]
        else:
            assert r.host.startswith("api.anthropic.com"), r
            assert all(f"Bearer {t}" in r.headers and t not in r.body for t in carried)
        assert PLACEHOLDER not in r.headers + r.body
    assert not [p for p in creds.parent.iterdir() if ".keeper-" in p.name]
    inside_token.check("claude", o, out, host_refreshes=1)
    turn = [r for r in o.seen if r.path.endswith("/v1/messages")]
    assert f"Bearer {first[0]}" in turn[0].headers and f"Bearer {o.access}" in turn[-1].headers


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, *sys.argv[1:]]))
