"""The gateway container's entry command, run here as the Deployment runs it.

The argv is read from deploy/kubernetes/base/gateway-deployment.yaml; only the
addresses (to 127.0.0.1 port 0) and the control socket's directory (to a temp
dir standing for the pod's emptyDir) change.  A tenant is added over the
control socket with a --secrets file laid out as the mounted Secret is and its
record on /dev/stdout (the container's log stream); real curl goes through
with and without the tenant's credential.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

from gateway_pod import DEPLOY, Running, container, curl, local_argv, mounted_secrets, pod_spec
from k8s_schemas import ROOT

from libegress.control import control_request


def test_the_entry_command_serves_a_tenant_added_over_the_control_socket(
        gateway: Running, upstream: int, tmp_path: Path) -> None:
    assert container()["command"][0] == "egress-proxy"
    mode = os.stat(gateway.control).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    secrets = mounted_secrets(tmp_path)
    added = control_request(gateway.control, {
        "op": "add", "tenant": "session-1",
        "policy": {"allow": f"upstream.test:{upstream}", "resolve": ["upstream.test:127.0.0.1"],
                   "allow_cidr": ["127.0.0.1/32"], "secrets": str(secrets / "secrets.json"),
                   "record": "/dev/stdout"}})
    assert added["ok"], added
    user = f"session-1:{added['password']}"
    assert control_request(gateway.control, {"op": "list"})["tenants"] == [
        {"tenant": "session-1", "connections": 0}]

    before = len(gateway.out)
    assert curl(gateway.http, f"http://upstream.test:{upstream}/", user) == "200"
    assert curl(gateway.http, "http://elsewhere.test/", user) == "403"
    assert curl(gateway.http, f"http://upstream.test:{upstream}/", None) == "407"
    assert curl(gateway.http, f"http://upstream.test:{upstream}/", "session-1:" + "x" * 43) == "407"
    # The tenant's record: one JSON line per decision on the container's stdout.
    records = [json.loads(line) for line in gateway.lines_after(before, 2)]
    assert [(r["host"], r["verdict"]) for r in records] == [
        ("upstream.test", "allowed"), ("elsewhere.test", "refused")]
    assert all(r["tenant"] == "session-1" for r in records)  # told apart on a shared stdout

    assert control_request(gateway.control, {"op": "remove", "tenant": "session-1"})["ok"]
    assert curl(gateway.http, f"http://upstream.test:{upstream}/", user) == "407"
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(timeout=15) == 0
    assert not os.path.exists(gateway.control)
    stderr = gateway.proc.stderr.read() if gateway.proc.stderr else ""
    assert added["password"] not in stderr and "sk-test-" not in stderr
    assert "tenant=session-1" in stderr
    assert "secret for" not in stderr  # the mounted secret was read at add


def test_the_argv_is_the_deployments_but_for_addresses_and_the_socket_dir(
        tmp_path: Path) -> None:
    deployed = container()["command"]
    local = local_argv(tmp_path)
    assert [a.split("=", 1)[0] for a in local] == [a.split("=", 1)[0] for a in deployed]
    assert sum(a != b for a, b in zip(local, deployed, strict=True)) == 3


def test_the_image_runs_as_the_deployments_user_with_the_projects_scripts() -> None:
    containerfile = (DEPLOY / "Containerfile").read_text()
    uid = pod_spec()["securityContext"]["runAsUser"]
    assert f"USER {uid}:{uid}" in containerfile
    scripts = ("egress-proxy", "broker-server")
    pyproject = (ROOT / "pyproject.toml").read_text()
    for script in scripts:
        assert f'\n{script} = "bin.' in pyproject
        assert script in containerfile
