"""Codex's ChatGPT login stays on the host: the real CLI, both backends.

The home holds a ChatGPT login (``~/.codex/auth.json``: JWT id and access
tokens, a refresh token, the account) issued by a stand-in token endpoint
(``auth.openai.com``) and backend (``chatgpt.com/backend-api/codex``), over
TLS on loopback through the config's ``resolve`` pins.  No config for it:
the launcher sees the login (libbroker.launcher.logins).

A turn completes; the access token expires mid-session, is refreshed on the
host (the stand-in revokes the old pair), and the next turn works; the
rotated tokens are in the person's file after the session, with its mode;
no real token is found inside (the scan runs in the session while the second
turn's codex runs: this Codex sends the stand-in's RUN prompt in a shape its
script does not read as a tool call); only the host's refresh carries the
refresh token; a process inside posting the placeholder refresh token gets
placeholders from egress-proxy, anything else there is refused, and Codex
forced to refresh inside goes on working (inside_token.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import inside_token
import pytest
from agents_world import Home, need
from inside_scan import SCAN, report, split
from standin_oauth import ACCOUNT, Oauth, run_logged_in, serving

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


SESSION = """
codex exec --skip-git-repo-check hello || exit 1
i=0; while [ ! -e refreshed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e refreshed ] || { echo NO-REFRESH; exit 1; }
codex exec --skip-git-repo-check hello > turn2.out 2>&1 &
sleep 2; python3 scan.py; wait $! || exit 1; cat turn2.out
"""
LEARN = "import json\nEXTRA_PARTS = [tuple(p) for p in json.load(open('refreshed'))]\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chatgpt_login_works_refreshes_on_the_host_and_stays_outside(
    world: Home, oauth: Oauth, backend: str
) -> None:
    need("codex")
    w, o = world, oauth
    auth = login(w, o, MARGIN_S + 8)
    first = [o.id_token, *o.secrets()]
    flag = w.workdir / "refreshed"
    o.on_refresh = lambda: flag.write_text(json.dumps(split(o.id_token, *o.secrets())))
    (w.workdir / "scan.py").write_text(LEARN + SCAN.format(parts=split(*first)))
    done = run(w, o, backend, SESSION)
    out = done.stdout
    report(f"oauth codex {backend} turn+host-refresh", out)
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert out.count("pong") >= 2 and "SCANNED" in out, out + done.stderr[-2500:]
    assert "FOUND" not in out, out
    assert ("agent-sandbox: codex's login stays on this host: egress-proxy sends its token "
            "to chatgpt.com and refreshes it (the session holds placeholders)" in done.stderr)
    (refresh,) = o.refreshes()
    assert json.loads(refresh.body) == {"client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                                        "grant_type": "refresh_token",
                                        "refresh_token": first[2]}
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refresh_from_inside_gets_placeholders_and_the_agent_goes_on(
    world: Home, oauth: Oauth, backend: str
) -> None:
    """auth.openai.com (served by egress-proxy) answers the placeholder refresh
    token with placeholder JWTs and refuses the rest; Codex, its copy's access
    token expired, refreshes inside and takes its turn; nothing real inside."""
    need("codex")
    w, o = world, oauth
    auth = login(w, o, 8 * 3600)
    before = auth.read_text()
    (w.workdir / "scan.py").write_text(SCAN.format(parts=split(o.id_token, *o.secrets())))
    done = run(w, o, backend, inside_token.script("codex"))
    report(f"oauth codex {backend} refresh-inside", done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    inside_token.check("codex", o, done.stdout)
    assert auth.read_text() == before
    turn = [r for r in o.seen if r.path.endswith("/codex/responses")]
    assert turn and all(f"Bearer {o.access}" in r.headers for r in turn)
