"""A held login's token host through the real egress-proxy and the real keeper.

egress-proxy gets ``--secrets`` entries naming a Google login (the keeper on a
login file, pinned to the stand-in token endpoint of tests/agents); curl
trusts the proxy's CA.  What the session-level tests cannot show cheaply:

- the real access token goes to ``oauth2.googleapis.com/tokeninfo`` and
  nowhere else on that host, and the client's own Authorization never goes;
- a refresh with the placeholder never reaches the token endpoint;
- a body over the limit is refused (413) with one log line;
- every refusal is one log line, with the reason and no token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc, start_proxy
from egress_world import require

sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))

from standin_oauth import (
    GCLOUD_ACCESS,
    GCLOUD_CLIENT_ID,
    GCLOUD_REFRESH,
    GEMINI_CLIENT_ID,
    Oauth,
    start,
)

MARK = "agent-sandbox-placeholder"


@dataclass
class Rig:
    o: Oauth
    proxy: ProxyProc
    egress: Path
    creds: Path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    require("curl")
    tmp = tmp_path_factory.mktemp("login-host")
    o, server = start(tmp)
    o.gemini()
    creds = tmp / "gemini" / "oauth_creds.json"
    creds.parent.mkdir()
    creds.write_text(json.dumps({"access_token": o.access, "refresh_token": o.refresh,
                                 "expiry_date": int((time.time() + 8 * 3600) * 1000),
                                 "scope": "s", "token_type": "Bearer"}))
    keeper = (f"{sys.executable} -m libegress.login_keeper gemini {creds} "
              f"--resolve=oauth2.googleapis.com:127.0.0.1:{o.port} --ca={o.ca_file}")
    secrets = [{"host": h, "header": "Authorization", "command": keeper, "login": "gemini"}
               for h in ("cloudcode-pa.googleapis.com", "oauth2.googleapis.com")]
    (tmp / "secrets.json").write_text(json.dumps(secrets))
    egress = tmp / "egress"
    args = ["--secrets", str(tmp / "secrets.json"), "--upstream-ca", str(o.ca_file),
            "--egress-dir", str(egress), "--inject", "",
            "--resolve", f"oauth2.googleapis.com:127.0.0.1:{o.port}",
            "--resolve", f"cloudcode-pa.googleapis.com:127.0.0.1:{o.port}"]
    proxy = start_proxy(args, log=tmp / "proxy.log")
    yield Rig(o, proxy, egress, creds)
    assert proxy.stop() == 0
    server.shutdown()
    server.server_close()


def curl(rig: Rig, path: str, *extra: str) -> tuple[str, str]:
    argv = ["curl", "-sS", "--max-time", "15", "-x", rig.proxy.http, "--cacert",
            str(rig.egress / "ca.pem"), "-D", "-", "--suppress-connect-headers", *extra,
            f"https://oauth2.googleapis.com{path}"]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    head, _, body = done.stdout.partition("\n\n")  # text mode: CRLF read as LF
    return head, body


def test_the_real_token_goes_to_tokeninfo_only_and_never_the_clients(rig: Rig) -> None:
    o = rig.o
    o.seen.clear()
    head, body = curl(rig, "/tokeninfo", "-X", "POST", "-H", f"Authorization: Bearer ya29.{MARK}")
    assert head.startswith("HTTP/1.1 200") and json.loads(body)["email"] == "p@example.com"
    head, _ = curl(rig, "/elsewhere", "-X", "POST", "-H", "Authorization: Bearer mine")
    assert head.startswith("HTTP/1.1 404")
    info, other = o.seen[-2:]
    assert f"Bearer {o.access}" in info.headers and MARK not in info.headers
    # a bearer the client brought goes as it came, never replaced, never the real one
    assert "Bearer mine" in other.headers and o.access not in other.headers


def curl_to(rig: Rig, host: str, path: str, *extra: str) -> tuple[str, str]:
    argv = ["curl", "-sS", "--max-time", "15", "-x", rig.proxy.http, "--cacert",
            str(rig.egress / "ca.pem"), "-D", "-", "--suppress-connect-headers", *extra,
            f"https://{host}{path}"]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    head, _, body = done.stdout.partition("\n\n")
    return head, body


API = "cloudcode-pa.googleapis.com"


@pytest.mark.parametrize(("host", "path", "headers", "goes"), [
    # the placeholder is replaced by the real token
    (API, "/v1internal:loadCodeAssist", [f"Authorization: Bearer ya29.{MARK}"], "REAL"),
    # a credential the request brought itself goes as it came, nothing added
    (API, "/v1internal:loadCodeAssist", ["Authorization: Bearer ya29.its-own"],
     "Authorization: Bearer ya29.its-own"),
    (API, "/v1internal:loadCodeAssist", ["x-goog-api-key: its-own-key"], "x-goog-api-key"),
    (API, "/v1internal:loadCodeAssist", ["x-api-key: its-own-key"], "x-api-key: its-own-key"),
    ("oauth2.googleapis.com", "/tokeninfo", ["Authorization: Bearer ya29.its-own"],
     "Authorization: Bearer ya29.its-own"),
])
def test_the_real_token_replaces_the_placeholder_only_never_a_credential_of_its_own(
        rig: Rig, host: str, path: str, headers: list[str], goes: str) -> None:
    o = rig.o
    o.seen.clear()
    curl_to(rig, host, path, "-X", "POST", "-d", "{}", *(a for h in headers for a in ("-H", h)))
    (seen,) = o.seen
    if goes == "REAL":
        assert f"Bearer {o.access}" in seen.headers and MARK not in seen.headers
    else:
        assert goes.lower() in seen.headers.lower() and o.access not in seen.headers
        assert seen.headers.lower().count("authorization") == ("authorization" in goes.lower())


def test_gclouds_own_refresh_on_the_token_host_passes_untouched(rig: Rig) -> None:
    o = rig.o
    o.seen.clear()
    log_before = rig.proxy.log_text()
    head, body = curl(rig, "/token", "-d", f"client_id={GCLOUD_CLIENT_ID}",
                      "-d", "client_secret=d-FL95Q19q7MQmFpd7hHD0Ty", "-d",
                      "grant_type=refresh_token", "-d", f"refresh_token={GCLOUD_REFRESH}")
    assert head.startswith("HTTP/1.1 200") and json.loads(body)["access_token"] == GCLOUD_ACCESS
    (seen,) = o.seen
    assert GCLOUD_REFRESH.replace("/", "%2F") in seen.body or GCLOUD_REFRESH in seen.body
    assert o.access not in seen.headers + seen.body and MARK not in seen.headers + seen.body
    assert "blocked-login" not in rig.proxy.log_text()[len(log_before):]


def test_a_placeholder_refresh_is_answered_and_never_reaches_the_endpoint(rig: Rig) -> None:
    o = rig.o
    o.seen.clear()
    before = rig.creds.read_text()
    head, body = curl(rig, "/token", "-d", "grant_type=refresh_token",
                      "-d", f"client_id={GEMINI_CLIENT_ID}", "-d", "client_secret=GOCSPX-x",
                      "--data-urlencode", f"refresh_token=1//{MARK}")
    assert head.startswith("HTTP/1.1 200") and "no-store" in head.lower()
    answer = json.loads(body)
    assert answer["access_token"] == f"ya29.{MARK}" and answer["refresh_token"] == f"1//{MARK}"
    assert o.seen == [] and rig.creds.read_text() == before
    assert o.access not in body and o.refresh not in body


@pytest.mark.parametrize(("args", "status", "reason"), [
    (["-d", "grant_type=refresh_token", "-d", "refresh_token=1//someone-elses"], 403,
     "gemini's login is held on the host: only the session's placeholder refresh token is "
     "answered"),
    (["-d", "grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer", "-d", "assertion=x"], 403,
     "gemini's login is held on the host: grant 'urn:ietf:params:oauth:grant-type:jwt-bearer' "
     "is not answered for the session"),
    (["-X", "POST", "-H", "Content-Type: application/x-www-form-urlencoded",
      "--data-binary", "@-"], 413,
     "a request to a login's token host over 262144 bytes"),
    (["-G", "--data-urlencode", f"token=1//{MARK}", "-X", "POST"], 403,
     "gemini's login is held on the host: the session's placeholder gets nothing here"),
])
def test_refusals_name_their_reason_in_the_answer_and_one_log_line(
        rig: Rig, args: list[str], status: int, reason: str) -> None:
    o = rig.o
    o.seen.clear()
    path = "/revoke" if "-G" in args else "/token"
    log_before = rig.proxy.log_text()
    if "@-" in args:  # a body over the limit, on stdin
        big = rig.proxy.log.parent / "big" if rig.proxy.log else Path("big")
        big.write_bytes(b"a=" + b"x" * (300 * 1024))
        args = [a if a != "@-" else f"@{big}" for a in args]
    head, body = curl(rig, path, *args)
    assert head.startswith(f"HTTP/1.1 {status}"), head
    assert "x-proxy-error: blocked-login" in head.lower()
    assert body == f"egress-proxy: {reason}\n"
    assert o.seen == []
    new = rig.proxy.log_text()[len(log_before):]
    assert new.count("\n") == 1 and reason in new and "host=oauth2.googleapis.com" in new, new
    assert o.access not in new and o.refresh not in new
