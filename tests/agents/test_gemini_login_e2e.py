"""Gemini CLI's Google login stays on the host: the real CLI, both backends.

The home holds a Google login (``~/.gemini/oauth_creds.json``) issued by a
stand-in Google token endpoint, tokeninfo and Code Assist API
(``oauth2.googleapis.com``, ``cloudcode-pa.googleapis.com``; TLS on
loopback, the config's ``resolve`` pins).  No config for it: the launcher
sees the login (libbroker.launcher.logins).

A turn completes; the access token comes due mid-session and is refreshed on
the host (Google's refresh token does not rotate), and the next turn works
with the new access token; the new access token and expiry
are in the person's file after the session, with its mode; no real token is
found inside; only the host's refresh carries the refresh token; a process
inside posting the placeholder refresh token gets placeholders from
egress-proxy and anything else there is refused, and the CLI forced to
refresh inside goes on working (inside_token.py); the real access token goes
to the token host's /tokeninfo only.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import inside_token
import pytest
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import GEMINI_CLIENT_ID, Oauth, run_logged_in, serving

BACKENDS = ("bwrap", "nono")
MARGIN_S = 300  # libegress.oauth_login.MARGIN_MS
PLACEHOLDER = "agent-sandbox-placeholder"


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    with serving(tmp_path) as found:
        yield found


# The id token's signature, which the scan inside must not find.  Spelled in two
# parts: this file is readable inside the session (the checkout is), and a
# checkout under /tmp (CI's clone) is within the scan's walk.
ID_SIGNATURE = "IDSIG-" + "real"


def login(w: Home, o: Oauth, expires_in_s: float) -> Path:
    o.gemini()
    gem = w.home / ".gemini"
    (gem / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "oauth-personal"}}}))
    (gem / "google_accounts.json").write_text(json.dumps({"active": "p@example.com", "old": []}))
    creds = gem / "oauth_creds.json"
    creds.write_text(json.dumps({
        "access_token": o.access, "refresh_token": o.refresh, "token_type": "Bearer",
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "id_token": "eyJhbGciOiJSUzI1NiJ9.eyJlbWFpbCI6InBAZXhhbXBsZS5jb20ifQ." + ID_SIGNATURE,
        "expiry_date": int((time.time() + expires_in_s) * 1000)}))
    creds.chmod(0o640)
    return creds


def run(w: Home, o: Oauth, backend: str, script: str) -> subprocess.CompletedProcess[str]:
    return run_logged_in(w, o, backend, "gemini", "GEMINI_API_KEY", script, timeout=180)


SESSION = """
gemini --skip-trust -p hello || exit 1
i=0; while [ ! -e refreshed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e refreshed ] || { echo NO-REFRESH; exit 1; }
gemini --skip-trust --yolo -p 'RUN<<python3 scan.py>>'
"""
LEARN = "import json\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))]\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_google_login_works_refreshes_on_the_host_and_stays_outside(
    world: Home, oauth: Oauth, backend: str
) -> None:
    need("gemini")
    w, o = world, oauth
    # Due for refresh 14 s in: the first turn is seconds (one node start, no relaunch
    # here: agents_world.py), the wait for the refresh the test's own cost.
    creds = login(w, o, MARGIN_S + 14)
    first = [*o.secrets(), ID_SIGNATURE]
    flag = w.workdir / "refreshed"
    o.on_refresh = lambda: flag.write_text(json.dumps(split(*o.secrets())))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    done = run(w, o, backend, SESSION)
    out = done.stdout
    report(f"oauth gemini {backend} turn+host-refresh", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "pong" in out and "RESULT<<" in out and "SCANNED" in out, out + done.stderr[-2000:]
    assert "FOUND" not in out, out
    assert ("agent-sandbox: gemini's login stays on this host: egress-proxy sends its token "
            "to cloudcode-pa.googleapis.com and refreshes it (the session holds placeholders)"
            in done.stderr)
    (refresh,) = o.refreshes()
    assert f"client_id={GEMINI_CLIENT_ID}" in refresh.body and first[1] in unquote(refresh.body)
    held = json.loads(creds.read_text())
    assert (held["access_token"], held["refresh_token"]) == (o.access, o.refresh)
    assert o.access != first[0] and held["expiry_date"] > (time.time() + 3600) * 1000
    assert creds.stat().st_mode & 0o777 == 0o640
    turns = [r for r in o.seen if r.path.startswith("/v1internal:streamGenerateContent")]
    assert f"Bearer {first[0]}" in turns[0].headers and f"Bearer {o.access}" in turns[-1].headers
    for r in o.seen:
        carried = {t for t in o.secrets() if t in r.headers + unquote(r.body)}
        if r.path == "/token":
            assert carried == {o.refresh}
        else:
            assert all(f"Bearer {t}" in r.headers and t not in r.body for t in carried), r
        assert "1//" + PLACEHOLDER not in r.headers + unquote(r.body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refresh_from_inside_gets_placeholders_and_the_agent_goes_on(
    world: Home, oauth: Oauth, backend: str
) -> None:
    """oauth2.googleapis.com/token (served by egress-proxy) answers the placeholder
    refresh token with placeholders and refuses the rest; Gemini CLI, its copy's
    login expired, refreshes inside and takes its turn; nothing real inside;
    the real access token went to tokeninfo and the APIs only, never to /token."""
    need("gemini")
    w, o = world, oauth
    w.gemini_relaunch = True  # the real relaunch, parent and child node (agents_world.py)
    creds = login(w, o, 8 * 3600)
    before = creds.read_text()
    (w.workdir / "scan.py").write_text(
        SCAN.format(parts=split(*o.secrets(), ID_SIGNATURE)))
    done = run(w, o, backend, inside_token.script("gemini"))
    report(f"oauth gemini {backend} refresh-inside", done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    inside_token.check("gemini", o, done.stdout)
    assert creds.read_text() == before
    turn = [r for r in o.seen if r.path.startswith("/v1internal:streamGenerateContent")]
    assert turn and all(f"Bearer {o.access}" in r.headers for r in turn)
    assert {r.path for r in o.seen if o.access in r.headers} <= {
        "/tokeninfo", "/oauth2/v2/userinfo"} | {r.path for r in o.seen if
                                               r.path.startswith("/v1internal:")}
