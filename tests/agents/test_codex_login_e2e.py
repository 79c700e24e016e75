"""Codex's ChatGPT login stays on the host: the real CLI, both backends.

The home holds a ChatGPT login (``~/.codex/auth.json``: JWT id and access
tokens, a refresh token, the account) issued by a stand-in token endpoint
(``auth.openai.com``) and backend (``chatgpt.com/backend-api/codex``), over
TLS on loopback through the config's ``resolve`` pins.  No config for it:
the launcher sees the login (libbroker.launcher.logins).

A turn completes (the refresh from inside's, below); the access token comes
due mid-session (the person's file says so: standin_oauth.comes_due), is
refreshed on the host (the stand-in revokes the old pair), and the next turn
works; the rotated tokens are in the person's file after the session, with its
mode; no real token is found inside (the scan runs in the session while the
second turn's codex runs: this Codex sends the stand-in's RUN prompt in a
shape its script does not read as a tool call); only the host's refresh
carries the refresh token; in the same session, first, a process inside
posting the placeholder refresh token gets placeholders from egress-proxy,
anything else there is refused, and Codex forced to refresh inside goes on
working (inside_token.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import inside_token
import pytest
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import ACCOUNT, Oauth, comes_due, run_logged_in, serving

BACKENDS = ("bwrap", "nono")
MARGIN_S = 300  # libegress.oauth_login.MARGIN_MS
PLACEHOLDER = "agent-sandbox-placeholder"


@pytest.fixture()
def oauth(tmp_path: Path) -> Iterator[Oauth]:
    with serving(tmp_path) as found:
        yield found


def login(w: Home, o: Oauth, expires_in_s: float) -> Path:
    o.codex(expires_in_s)
    (w.home / ".codex" / "config.toml").write_text(
        'model = "gpt-standin"\ncheck_for_update_on_startup = false\n')
    auth = w.home / ".codex" / "auth.json"
    auth.write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": {
        "id_token": o.id_token, "access_token": o.access, "refresh_token": o.refresh,
        "account_id": ACCOUNT}, "last_refresh": "2026-01-01T00:00:00Z"}))
    auth.chmod(0o640)
    return auth


def run(w: Home, o: Oauth, backend: str, script: str) -> subprocess.CompletedProcess[str]:
    return run_logged_in(w, o, backend, "codex", "OPENAI_API_KEY", script, timeout=180)


# One session per backend proves both refreshes (a session costs the servers' start
# and Codex's): first the refresh from inside (inside_token.py: its turn is the one
# with the first token), then the host's login comes due (``due``: comes_due), and the
# next turn, with the refreshed token, runs while the scan does.
AFTER = """
touch due
i=0; while [ ! -e refreshed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e refreshed ] || { echo NO-REFRESH; exit 1; }
codex exec --skip-git-repo-check hello > turn2.out 2>&1 &
sleep 2; python3 scan.py; wait $! || exit 1; cat turn2.out
"""
# (the scan of the part before the host's refresh learns nothing yet)
LEARN = ("import json, os\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))] "
         "if os.path.exists('refreshed') else []\n")


def _holding(access: str) -> Callable[[dict[str, object]], None]:
    def hold(data: dict[str, object]) -> None:
        tokens = data["tokens"]
        assert isinstance(tokens, dict)
        tokens["access_token"] = access
    return hold


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chatgpt_login_works_refreshes_on_the_host_and_stays_outside(
    world: Home, oauth: Oauth, backend: str
) -> None:
    """And a refresh from inside: auth.openai.com (served by egress-proxy) answers the
    placeholder refresh token with placeholder JWTs and refuses the rest; Codex, its
    copy's access token expired, refreshes inside and takes its turn with the host's
    token; nothing real inside; the person's file holds the host's refresh only."""
    need("codex")
    w, o = world, oauth
    auth = login(w, o, 8 * 3600)
    # Codex's expiry is its access token's exp claim: the token the person's file holds
    # once it comes due is that token with exp a minute inside the keeper's margin (the
    # keeper refreshes it at once: it is never sent, and never inside either).
    header, claims, signature = o.access.split(".")
    claims = base64.urlsafe_b64encode(json.dumps({**json.loads(base64.urlsafe_b64decode(
        claims + "==")), "exp": int(time.time() + MARGIN_S - 60)}).encode()).decode()
    due_token = ".".join([header, claims.rstrip("="), signature])
    first = [o.id_token, *o.secrets(), due_token]
    flag = w.workdir / "refreshed"
    o.on_refresh = lambda: flag.write_text(json.dumps(split(o.id_token, *o.secrets())))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    due = comes_due(w.workdir / "due", auth, _holding(due_token))
    done = run(w, o, backend, inside_token.script("codex") + AFTER)
    due.join(timeout=10)
    out = done.stdout
    report(f"oauth codex {backend} refresh-inside+host-refresh+turn", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    after = out.split("HELD ", 1)[-1]  # the inside part's scan, then the last turn's
    assert after.count("SCANNED") >= 2 and "pong" in after, out + done.stderr[-2500:]
    assert "FOUND" not in out, out
    assert ("agent-sandbox: codex's login stays on this host: egress-proxy sends its token "
            "to chatgpt.com and refreshes it (the session holds placeholders)" in done.stderr)
    (refresh,) = o.refreshes()
    assert json.loads(refresh.body) == {"client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                                        "grant_type": "refresh_token",
                                        "refresh_token": first[2]}
    # (the refresh inside changed neither the person's file nor the real pair)
    held = json.loads(auth.read_text())
    assert held["tokens"] == {"id_token": o.id_token, "access_token": o.access,
                              "refresh_token": o.refresh, "account_id": ACCOUNT}
    assert held["last_refresh"] > "2026-01-01T00:00:00Z"
    assert auth.stat().st_mode & 0o777 == 0o640
    for r in o.seen:
        carried = [t for t in o.secrets() if t in r.headers + r.body]
        if r.path == "/oauth/token":
            assert carried == [first[2]]
        else:
            assert r.host.startswith("chatgpt.com"), r
            assert all(f"Bearer {t}" in r.headers and t not in r.body for t in carried)
        assert "rt_" + PLACEHOLDER not in r.headers + r.body
        assert due_token not in r.headers + r.body
    inside_token.check("codex", o, out, host_refreshes=1)
    turn = [r for r in o.seen if r.path.endswith("/codex/responses")]
    assert f"Bearer {first[1]}" in turn[0].headers and f"Bearer {o.access}" in turn[-1].headers
