"""The claims controller against a stand-in API server (TLS, bearer token) and a real gateway.

The gateway is the Deployment's entry command (test_gateway_entry's fixture);
the controller runs as the pod would run it (``--once`` per round, its
environment pointing at the stand-in and a service-account directory laid out
as the kubelet lays it).  Checked: a bound claim gets a tenant and a Secret
owned by the claim, written before the tenant exists; the password works and
only for it; an unbound claim gets nothing; a deleted claim's tenant goes (407
after); a restarted gateway gets its tenants back with the same passwords;
the password is in no log; a labelled Sandbox gets the same, read by its pod from the
Secret; two replicas end with the same tenants and passwords.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from gateway_pod import Running, container, curl, mount, running
from k8s_schemas import DEPLOY
from kubelet import pod_env

from libegress.control import control_request

SCRIPT = DEPLOY / "controller" / "claims_controller.py"
TOKEN = "sa-token-" + "t" * 20
NS = "agent-sandboxes"


class FakeApi:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.sandboxes: dict[str, dict[str, Any]] = {}  # labelled for a credential
        self.pool: dict[str, dict[str, Any]] = {}  # a warm pool's Sandboxes (not labelled)
        self.reviews: dict[str, dict[str, Any]] = {}  # token -> TokenReview status
        self.secrets: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.listed_secrets = lambda: list(self.secrets.values())  # the label selector's view

    def claim(self, name: str, bound: bool, allow: str | None = None) -> None:
        obj: dict[str, Any] = {"metadata": {"name": name, "uid": f"uid-{name}"}}
        if allow is not None:
            obj["metadata"]["annotations"] = {"egress.agent-sandbox/allow": allow}
        if bound:
            obj["status"] = {"sandbox": {"name": f"pool-{name}"}}
        self.claims[name] = obj


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApi, dict[str, str]]]:
    state = FakeApi()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            state.calls.append(f"{self.command} {self.path}")
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._reply(401, {"kind": "Status", "code": 401})
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorized():
                return
            claims = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{NS}/sandboxclaims"
            if self.path == claims:
                self._reply(200, {"items": list(state.claims.values())})
            elif self.path == (f"/apis/agents.x-k8s.io/v1beta1/namespaces/{NS}/sandboxes"
                               "?labelSelector=egress.agent-sandbox/credential%3Dtrue"):
                self._reply(200, {"items": list(state.sandboxes.values())})
            elif self.path == f"/apis/agents.x-k8s.io/v1beta1/namespaces/{NS}/sandboxes":
                self._reply(200, {"items": [*state.sandboxes.values(), *state.pool.values()]})
            elif self.path == (f"/api/v1/namespaces/{NS}/secrets"
                               "?labelSelector=agent-sandbox/egress-cred%3Dtrue"):
                self._reply(200, {"items": state.listed_secrets()})
            else:
                self._reply(404, {"path": self.path})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/apis/authentication.k8s.io/v1/tokenreviews":
                status = state.reviews.get(body["spec"]["token"], {"authenticated": False})
                assert body["spec"]["audiences"] == ["egress-gateway"]
                self._reply(201, {**body, "status": status})
                return
            name = body["metadata"]["name"]
            if name in state.secrets:
                self._reply(409, {"code": 409})
                return
            state.secrets[name] = body
            self._reply(201, body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(tls)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN + "\n")
    (sa / "namespace").write_text(NS)
    ca.cert_pem.write_to_path(str(sa / "ca.crt"))
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(server.server_address[1]), "TOKEN_DIR": str(sa)}
    try:
        yield state, env
    finally:
        server.shutdown()
        server.server_close()


def run_once(env: dict[str, str], control: str, **more: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    full.update(env, CONTROL=control, **more)
    return subprocess.run([sys.executable, str(SCRIPT), "--once"], capture_output=True,
                          text=True, timeout=30, env=full, check=False)


def password_of(state: FakeApi, claim: str) -> str:
    secret = state.secrets[f"egress-cred-{claim}"]
    assert base64.b64decode(secret["data"]["user"]).decode() == claim
    return base64.b64decode(secret["data"]["password"]).decode()


def test_a_bound_claim_gets_a_tenant_and_an_owned_secret_and_loses_it_with_the_claim(
        gateway: Running, upstream: int, api: tuple[FakeApi, dict[str, str]]) -> None:
    state, env = api
    allow = f"upstream.test:{upstream}"
    state.claim("session-1", bound=True, allow=allow)
    state.claim("waiting", bound=False)
    synced = Path(gateway.control).parent / "synced"  # what the readiness probe waits for
    assert not synced.exists()
    done = run_once(env, gateway.control)
    assert done.returncode == 0, done.stderr
    assert synced.exists()
    assert "claim session-1: tenant added" in done.stderr
    tenants = control_request(gateway.control, {"op": "list"})["tenants"]
    assert [t["tenant"] for t in tenants] == ["session-1"]
    assert list(state.secrets) == ["egress-cred-session-1"]
    owner = state.secrets["egress-cred-session-1"]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "SandboxClaim", "session-1", "uid-session-1")
    # The Secret was written before the tenant was added.
    assert [c.split()[0] for c in state.calls] == ["GET", "GET", "GET", "POST"]
    password = password_of(state, "session-1")
    assert len(password) >= 40
    before = len(gateway.out)
    assert curl(gateway.http, "http://elsewhere.test/", f"session-1:{password}") == "403"
    [line] = gateway.lines_after(before, 1)  # the tenant's record, on the proxy's stdout
    assert json.loads(line)["host"] == "elsewhere.test"
    assert curl(gateway.http, "http://elsewhere.test/", f"session-1:{'y' * 43}") == "407"
    assert curl(gateway.http, "http://elsewhere.test/", f"waiting:{password}") == "407"
    assert password not in done.stderr + done.stdout

    # A second round changes nothing; deleting the claim removes the tenant.
    assert run_once(env, gateway.control).returncode == 0
    assert len(state.secrets) == 1
    del state.claims["session-1"]
    done = run_once(env, gateway.control)
    assert "tenant session-1 removed" in done.stderr
    assert control_request(gateway.control, {"op": "list"})["tenants"] == []
    assert curl(gateway.http, "http://elsewhere.test/", f"session-1:{password}") == "407"


def test_a_restarted_gateway_gets_its_tenants_back_with_the_same_passwords(
        gateway: Running, api: tuple[FakeApi, dict[str, str]]) -> None:
    state, env = api
    state.claim("session-2", bound=True)
    assert run_once(env, gateway.control).returncode == 0
    password = password_of(state, "session-2")
    control_request(gateway.control, {"op": "remove", "tenant": "session-2"})  # as a restart
    done = run_once(env, gateway.control, EGRESS_ALLOW="")
    assert done.returncode == 0, done.stderr
    assert [c.split()[0] for c in state.calls].count("POST") == 1  # no second Secret
    assert curl(gateway.http, "http://elsewhere.test/", f"session-2:{password}") == "403"


def test_a_labelled_sandbox_gets_a_credential_its_pod_reads_from_the_secret(
        gateway: Running, api: tuple[FakeApi, dict[str, str]]) -> None:
    """The example Sandbox: the controller mints its Secret (owned by the Sandbox) and
    tenant; the pod's environment, built from the example's env and that Secret as the
    kubelet builds it, takes real curl through the gateway as that tenant."""
    state, env = api
    example = yaml.safe_load((DEPLOY / "examples" / "sandbox-with-credential.yaml").read_text())
    name = example["metadata"]["name"]
    state.sandboxes[name] = {"metadata": {**example["metadata"], "uid": f"uid-{name}"}}
    state.sandboxes["claimed"] = {"metadata": {"name": "claimed", "uid": "uid-x"}}
    state.claim("claimed", bound=True)  # one name, one tenant: the claim's
    done = run_once(env, gateway.control)
    assert done.returncode == 0, done.stderr
    assert f"sandbox {name}: tenant added" in done.stderr
    assert "claim claimed: tenant added" in done.stderr
    assert "claim claimed: name too long, not a tenant name, or both" in done.stderr
    owner = state.secrets[f"egress-cred-{name}"]["metadata"]["ownerReferences"][0]
    assert owner == {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                     "name": name, "uid": f"uid-{name}"}
    assert state.secrets["egress-cred-claimed"]["metadata"]["ownerReferences"][0][
        "kind"] == "SandboxClaim"
    secret = {k: base64.b64decode(v).decode()
              for k, v in state.secrets[f"egress-cred-{name}"]["data"].items()}
    host, port = gateway.http.removeprefix("http://").rsplit(":", 1)
    [agent] = example["spec"]["podTemplate"]["spec"]["containers"]
    pod = pod_env(agent, {f"egress-cred-{name}": secret},
                  {"EGRESS_GATEWAY_SERVICE_HOST": host, "EGRESS_GATEWAY_SERVICE_PORT_HTTP": port})
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}

    def fetch(environ: dict[str, str]) -> str:
        return subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
             "http://elsewhere.test/"], capture_output=True, text=True, timeout=40,
            env={**clean, **environ}, check=False).stdout

    before = len(gateway.out)
    # Off the annotation's allow list: judged by this tenant's policy, so the
    # credential from the Secret was taken.
    assert fetch(pod) == "403"
    [line] = gateway.lines_after(before, 1)
    assert json.loads(line)["tenant"] == name
    wrong = pod_env(agent, {f"egress-cred-{name}": {**secret, "password": "x" * 43}},
                    {"EGRESS_GATEWAY_SERVICE_HOST": host,
                     "EGRESS_GATEWAY_SERVICE_PORT_HTTP": port})
    assert fetch(wrong) == "407"
    assert secret["password"] not in done.stderr + done.stdout
    # The Sandbox deleted: its tenant goes, the claim's stays.
    del state.sandboxes[name]
    done = run_once(env, gateway.control)
    assert f"tenant {name} removed" in done.stderr
    assert [t["tenant"] for t in control_request(gateway.control, {"op": "list"})["tenants"]] == [
        "claimed"]
    assert fetch(pod) == "407"


def test_two_replicas_hold_the_same_tenants_with_the_same_passwords(
        gateway: Running, api: tuple[FakeApi, dict[str, str]], tmp_path: Path) -> None:
    """Two gateway pods, each with its controller, one API: both mint at once for a
    new claim (one create wins, the other gets 409 and takes the stored password next
    round); then either replica takes the claim's credential, and a deleted claim
    leaves both."""
    state, env = api
    state.claim("session-5", bound=True)
    (tmp_path / "replica-b").mkdir()
    with running(tmp_path / "replica-b") as second:
        done_a = run_once(env, gateway.control)
        assert "claim session-5: tenant added" in done_a.stderr, done_a.stderr
        password = password_of(state, "session-5")
        # Replica B listed the Secrets before A created its one (the race): B's own
        # create gets 409, and that claim waits a round on B.
        state.listed_secrets = lambda: []
        done_b = run_once(env, second.control)
        assert "claim session-5: HTTPError: HTTP Error 409" in done_b.stderr
        assert control_request(second.control, {"op": "list"})["tenants"] == []
        state.listed_secrets = lambda: list(state.secrets.values())
        done_b = run_once(env, second.control)
        assert "claim session-5: tenant added" in done_b.stderr
        for replica in (gateway, second):
            assert curl(replica.http, "http://elsewhere.test/", f"session-5:{password}") == "403"
            assert (Path(replica.control).parent / "synced").exists()
        del state.claims["session-5"]
        for replica in (gateway, second):
            assert run_once(env, replica.control).returncode == 0
            assert curl(replica.http, "http://elsewhere.test/", f"session-5:{password}") == "407"


def test_a_wrong_token_a_foreign_secret_or_no_gateway_fail_cleanly(
        gateway: Running, api: tuple[FakeApi, dict[str, str]], tmp_path: Path) -> None:
    state, env = api
    state.claim("session-3", bound=True)
    (Path(env["TOKEN_DIR"]) / "token").write_text("wrong")
    done = run_once(env, gateway.control)
    assert done.returncode == 1
    assert not (Path(gateway.control).parent / "synced").exists()  # not Ready
    assert "round failed: HTTPError" in done.stderr and "Traceback" not in done.stderr
    assert "wrong" not in done.stderr
    (Path(env["TOKEN_DIR"]) / "token").write_text(TOKEN)
    # A Secret of a claim's name that is not the controller's (no label, so not
    # listed; its create gets 409): that claim waits, the others get their tenants.
    state.secrets["egress-cred-session-3"] = {"metadata": {"name": "egress-cred-session-3"}}
    state.claim("session-4", bound=True)
    state.listed_secrets = lambda: [
        v for k, v in state.secrets.items() if k != "egress-cred-session-3"]
    done = run_once(env, gateway.control)
    assert done.returncode == 0, done.stderr
    assert "claim session-3: HTTPError: HTTP Error 409" in done.stderr
    assert "claim session-4: tenant added" in done.stderr
    assert [t["tenant"] for t in control_request(gateway.control, {"op": "list"})["tenants"]] == [
        "session-4"]
    done = run_once(env, str(tmp_path / "no-such.sock"))
    assert done.returncode == 1 and "Traceback" not in done.stderr


def test_the_deployment_runs_this_script_beside_the_proxy_on_the_same_socket() -> None:
    controller = container("claims-controller")
    assert controller["command"][:2] == [
        "python", f"/opt/agent-sandbox/controller/{SCRIPT.name}"]
    # The endpoint's module beside it: the script imports it from its own directory.
    assert (f"COPY deploy/kubernetes/controller/{SCRIPT.name} "
            "deploy/kubernetes/controller/credential_endpoint.py /opt/agent-sandbox/controller/"
            ) in (DEPLOY / "Containerfile").read_text()
    env = {e["name"]: e["value"] for e in controller["env"]}
    proxy_control = next(a for a in container()["command"] if a.startswith("--control="))
    assert proxy_control == f"--control={env['CONTROL']}"
    assert mount("control", "claims-controller") == mount("control")
    assert env["EGRESS_SECRETS"].startswith(mount("secrets") + "/")
    flags = controller["command"][2:]
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0
    assert all(f.split("=")[0] in done.stdout for f in flags)
    # Readiness waits for the file the controller creates beside the control socket.
    assert controller["readinessProbe"]["exec"]["command"] == [
        "test", "-e", os.path.join(os.path.dirname(env["CONTROL"]), "synced")]


def test_more_than_one_replica_rolls_without_losing_ready_ones() -> None:
    spec = yaml.safe_load((DEPLOY / "base" / "gateway-deployment.yaml").read_text())["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
