"""A warm pool's pod gets its claim's credential (credential_endpoint.py, egress-login.sh).

The claims controller runs as the pod runs it (its loop, ``--credential-listen``)
against the stand-in API server (test_claims_controller's, which answers
TokenReviews from a table) and the real gateway entry command.  The pod's side
is the overlay's real ``egress-login.sh`` with real curl, its token in a file
as the kubelet projects it.  Checked: a pod started before its claim waits, and
once the claim binds (its Sandbox adopting the pod: agents.x-k8s.io/pod-name)
runs its command with the claim's credential, which takes it through the gateway
as that tenant; a pod nobody claimed gets 404; a token of another namespace,
for another audience, not bound to a pod, or unknown gets 401 and one log line,
and the script stops with status 1; neither token nor password is logged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway_pod import Running
from k8s_schemas import DEPLOY
from test_claims_controller import NS, SCRIPT, FakeApi, api, password_of

__all__ = ["api"]  # the stand-in API server's fixture, for the tests here

LOGIN = DEPLOY / "overlays" / "agent-sandbox" / "egress-login.sh"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"


def review(pod: str | None, *, ns: str = NS, audience: str = "egress-gateway") -> dict[str, Any]:
    extra = {POD_NAME: [pod], POD_UID: [f"uid-{pod}"]} if pod else {}
    return {"authenticated": True, "audiences": [audience],
            "user": {"username": f"system:serviceaccount:{ns}:default", "extra": extra}}


def adopt(state: FakeApi, claim: str, pod: str) -> None:
    """The claim binds: its Sandbox (named as the stand-in names it) adopts the warm pod."""
    state.claim(claim, bound=True)
    sandbox = f"pool-{claim}"
    state.pool[sandbox] = {"metadata": {"name": sandbox, "uid": f"uid-{sandbox}",
                                        "annotations": {"agents.x-k8s.io/pod-name": pod}}}


def test_a_warm_pod_waits_for_its_claim_then_runs_with_its_credential(
        gateway: Running, api: tuple[FakeApi, dict[str, str]], tmp_path: Path) -> None:
    state, env = api
    tokens = {"warm": "tok-warm-" + "w" * 30, "idle": "tok-idle-" + "i" * 30,
              "other-ns": "tok-ons-" + "o" * 30, "api-aud": "tok-aud-" + "a" * 30,
              "unbound": "tok-unb-" + "u" * 30, "unknown": "tok-unk-" + "k" * 30}
    state.reviews = {tokens["warm"]: review("coding-agent-a1"),
                     tokens["idle"]: review("coding-agent-b2"),
                     tokens["other-ns"]: review("coding-agent-a1", ns="elsewhere"),
                     tokens["api-aud"]: review("coding-agent-a1",
                                               audience="https://kubernetes.default.svc"),
                     tokens["unbound"]: review(None)}
    adopt(state, "session-w", "coding-agent-a1")
    full = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    full.update(env, CONTROL=gateway.control, EGRESS_ALLOW="")
    ctl = subprocess.Popen([sys.executable, str(SCRIPT), "--every=0.2",
                            "--credential-listen=127.0.0.1:0"], env=full, text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log: list[str] = []
    assert ctl.stderr is not None
    reader = threading.Thread(target=lambda: log.extend(iter(ctl.stderr.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 20
        while not any("claim session-w: tenant added" in line for line in log):
            assert ctl.poll() is None and time.monotonic() < deadline, log
            time.sleep(0.05)
        port = next(re.search(r"credential endpoint on 127\.0\.0\.1:(\d+)", line)
                    for line in log if "credential endpoint" in line).group(1)  # type: ignore[union-attr]
        host, http = gateway.http.removeprefix("http://").rsplit(":", 1)

        def login(token: str, *cmd: str, **more: str) -> subprocess.Popen[str]:
            (tmp_path / "token").write_text(token)
            pod = {**full, "EGRESS_GATEWAY_SERVICE_HOST": host,
                   "EGRESS_GATEWAY_SERVICE_PORT_CREDENTIAL": port,
                   "EGRESS_GATEWAY_SERVICE_PORT_HTTP": http,
                   "EGRESS_TOKEN_FILE": str(tmp_path / "token"), "EGRESS_LOGIN_EVERY": "0.1",
                   **more}
            return subprocess.Popen(["sh", str(LOGIN), *cmd], env=pod, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        through = ('printf "%s " "$HTTPS_PROXY"; curl -sS --max-time 20 -o /dev/null '
                   '-w "%{http_code}" http://elsewhere.test/')
        # The claimed pod: its credential, which the gateway takes as that tenant (403: off
        # the tenant's empty list, not 407).
        out, err = login(tokens["warm"], "sh", "-c", through).communicate(timeout=60)
        password = password_of(state, "session-w")
        assert out == f"http://session-w:{password}@{host}:{http} 403", (out, err)
        # A warm pod not yet claimed waits, and goes on once its claim binds.
        waiting = login(tokens["idle"], "sh", "-c", through)
        time.sleep(1.0)
        assert waiting.poll() is None
        adopt(state, "session-late", "coding-agent-b2")
        out, err = waiting.communicate(timeout=60)
        assert out.startswith("http://session-late:") and out.endswith(" 403"), (out, err)
        # Every token that is not a claimed pod's here: 401, one line, status 1.
        for name in ("other-ns", "api-aud", "unbound", "unknown"):
            done = login(tokens[name], "true")
            _, err = done.communicate(timeout=30)
            assert done.returncode == 1 and "answered 401" in err, (name, err)
        # The claim deleted: its pod gets nothing any more.
        del state.claims["session-w"]
        done = subprocess.run(
            ["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", "%{http_code}",
             "-H", f"Authorization: Bearer {tokens['warm']}",
             f"http://127.0.0.1:{port}/v1/credential"],
            capture_output=True, text=True, timeout=30, check=False)
        assert done.stdout == "404", done
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(timeout=15)
        reader.join(timeout=5)
    text = "".join(log)
    assert text.count("credential refused: a token not of a pod here") == 4, text
    assert "credential given to pod coding-agent-a1 (claim session-w)" in text
    assert "credential given to pod coding-agent-b2 (claim session-late)" in text
    assert not [t for t in tokens.values() if t in text]
    assert password not in text
