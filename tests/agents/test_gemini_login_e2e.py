"""Gemini CLI's Google login stays on the host: the real CLI, both backends.

The home holds a Google login (``~/.gemini/oauth_creds.json``) issued by a
stand-in Google token endpoint, tokeninfo and Code Assist API
(``oauth2.googleapis.com``, ``cloudcode-pa.googleapis.com``; TLS on
loopback, the config's ``resolve`` pins).  No config for it: the launcher
sees the login (libbroker.launcher.logins).

A turn completes (the refresh from inside's, below); the access token comes
due mid-session (the person's file says so: standin_oauth.comes_due) and is
refreshed on the host (Google's refresh token does not rotate), and the next
turn works with the new access token; the new access token and expiry are in
the person's file after the session, with its mode; no real token is found
inside; only the host's refresh carries the refresh token. Beside the held
login, the session's own bearer and API key reach the API as they came (never
the real token) and gcloud's own refresh on the token host is answered by the
endpoint. In the same session, first, a process inside posting the placeholder
refresh token gets placeholders from egress-proxy and anything else there is
refused, and the CLI forced to refresh inside goes on working
(inside_token.py); the real access tokens go to the token host's /tokeninfo
and the APIs only. (Gemini CLI's real relaunch, parent and child node, is
test_login_inside_e2e's, both backends.)
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
from standin_oauth import (
    GCLOUD_ACCESS,
    GCLOUD_CLIENT_ID,
    GCLOUD_REFRESH,
    GEMINI_CLIENT_ID,
    Oauth,
    comes_due,
    run_logged_in,
    serving,
)

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


# One session per backend (a session costs the servers' start and the CLI's): first
# the refresh from inside (inside_token.py: its turn is the one with the first
# token), then the host's login comes due (``due``: comes_due) and meanwhile the
# session's own credentials go out, then the next turn, with the refreshed token, runs
# the scan.
AFTER = """
touch due
code() {{ curl -sS -o /dev/null -w '%{{http_code}}' "$@"; }}
echo "OWN-BEARER $(code -X POST -H 'Authorization: Bearer ya29.its-own' -d '{{}}' \
  https://cloudcode-pa.googleapis.com/v1internal:loadCodeAssist)"
echo "OWN-KEY $(code -X POST -H 'x-goog-api-key: its-own-key' -d '{{}}' \
  https://cloudcode-pa.googleapis.com/v1internal:loadCodeAssist)"
echo "GCLOUD $(curl -sS -d client_id={gcloud} -d client_secret=d-FL95Q19q7MQmFpd7hHD0Ty \
  -d grant_type=refresh_token -d refresh_token={refresh} https://oauth2.googleapis.com/token)"
i=0; while [ ! -e refreshed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e refreshed ] || {{ echo NO-REFRESH; exit 1; }}
gemini --skip-trust --yolo -p 'RUN<<python3 scan.py>>'
"""
# (the scan of the part before the host's refresh learns nothing yet)
LEARN = ("import json, os\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))] "
         "if os.path.exists('refreshed') else []\n")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_google_login_works_refreshes_on_the_host_and_stays_outside(
    world: Home, oauth: Oauth, backend: str
) -> None:
    need("gemini")
    w, o = world, oauth
    creds = login(w, o, 8 * 3600)  # (one node start per turn, no relaunch: agents_world.py)
    first = [*o.secrets(), ID_SIGNATURE]
    flag = w.workdir / "refreshed"
    o.on_refresh = lambda: flag.write_text(json.dumps(split(*o.secrets())))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    after = AFTER.format(gcloud=GCLOUD_CLIENT_ID, refresh=GCLOUD_REFRESH)
    due = comes_due(w.workdir / "due", creds, lambda d: d.update(
        expiry_date=int((time.time() + MARGIN_S - 60) * 1000)))
    done = run(w, o, backend, inside_token.script("gemini") + after)
    due.join(timeout=10)
    out = done.stdout
    report(f"oauth gemini {backend} refresh-inside+own+host-refresh+turn", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    tail = out.split("HELD ", 1)[-1]  # the inside part's scan, then the last turn's
    assert tail.count("SCANNED") >= 2 and "RESULT<<" in tail, out + done.stderr[-2000:]
    assert "FOUND" not in out, out
    assert ("agent-sandbox: gemini's login stays on this host: egress-proxy sends its token "
            "to cloudcode-pa.googleapis.com and refreshes it (the session holds placeholders)"
            in done.stderr)
    gcloud = [r for r in o.seen if GCLOUD_CLIENT_ID in r.body]
    (refresh,) = [r for r in o.refreshes() if r not in gcloud]
    assert f"client_id={GEMINI_CLIENT_ID}" in refresh.body and first[1] in unquote(refresh.body)
    # (the refresh inside changed neither the person's file nor the real login)
    held = json.loads(creds.read_text())
    assert (held["access_token"], held["refresh_token"]) == (o.access, o.refresh)
    assert o.access != first[0] and held["expiry_date"] > (time.time() + 3600) * 1000
    assert creds.stat().st_mode & 0o777 == 0o640
    turns = [r for r in o.seen if r.path.startswith("/v1internal:streamGenerateContent")]
    assert f"Bearer {first[0]}" in turns[0].headers and f"Bearer {o.access}" in turns[-1].headers
    for r in o.seen:
        carried = {t for t in o.secrets() if t in r.headers + unquote(r.body)}
        if r.path == "/token" and r not in gcloud:
            assert carried == {o.refresh}
        else:
            assert all(f"Bearer {t}" in r.headers and t not in r.body for t in carried), r
        assert "1//" + PLACEHOLDER not in r.headers + unquote(r.body)
    # The session's own credentials: its bearer and API key reached the API as they came
    # (the stand-in's own verdict), gcloud's own refresh was answered by the endpoint.
    assert "OWN-BEARER 401" in out and "OWN-KEY 401" in out, out
    assert GCLOUD_ACCESS in out.split("GCLOUD ", 1)[1].splitlines()[0], out
    own = [r for r in o.seen if "its-own" in r.headers]
    assert len(own) == 2 and not any(a in r.headers for r in own for a, _ in o.issued), own
    assert "authorization: bearer ya29.its-own" in own[0].headers.lower()
    assert "authorization" not in own[1].headers.lower()
    (one,) = gcloud
    assert not any(t in one.headers + one.body for t in o.secrets())
    assert PLACEHOLDER not in one.body
    # The refresh from inside, its turn with the host's current token; the real access
    # tokens went to tokeninfo and the APIs only, never to /token.
    inside_token.check("gemini", o, out, host_refreshes=1)
    real = [a for a, _ in o.issued]
    assert {r.path for r in o.seen if any(a in r.headers for a in real)} <= {
        "/tokeninfo", "/oauth2/v2/userinfo"} | {r.path for r in o.seen if
                                               r.path.startswith("/v1internal:")}
