"""The gateway container's entry command, run here as the Deployment runs it.

The argv is read from deploy/kubernetes/base/gateway-deployment.yaml; only the
addresses (to 127.0.0.1 port 0) and the control socket's directory (to a temp
dir standing for the pod's emptyDir) change.  A tenant is added over the
control socket with a --secrets file laid out as the mounted Secret is and its
record on /dev/stdout (the container's log stream); real curl goes through
with and without the tenant's credential.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import DEPLOY, ROOT

from libegress.control import control_request

DEPLOYMENT = DEPLOY / "base" / "gateway-deployment.yaml"


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    [c] = pod_spec()["containers"]
    return c


def mount(name: str) -> str:
    [path] = [m["mountPath"] for m in container()["volumeMounts"] if m["name"] == name]
    return str(path)


def local_argv(control_dir: Path) -> list[str]:
    """The Deployment's argv with loopback addresses and the control socket under control_dir."""
    argv: list[str] = []
    for arg in container()["command"]:
        flag, _, value = arg.partition("=")
        if flag in ("--listen", "--socks"):
            value = "127.0.0.1:0"
        elif flag == "--control":
            assert os.path.dirname(value) == mount("control")  # the shared emptyDir
            value = str(control_dir / os.path.basename(value))
        argv.append(f"{flag}={value}" if value else flag)
    return argv


@dataclass
class Running:
    proc: subprocess.Popen[str]
    control: str
    http: str
    out: list[str] = field(default_factory=list)

    def lines_after(self, n: int, want: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.out) < n + want and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.out[n:]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Running]:
    run = tmp_path / "run-egress"
    run.mkdir(mode=0o700)
    argv = local_argv(run)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    out: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    deadline = time.monotonic() + 20
    while not any(line.startswith("listening http://") for line in out):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no listening line"
        time.sleep(0.02)
    http = next(line for line in out if line.startswith("listening http://")).split()[1]
    control = next(a for a in argv if a.startswith("--control=")).split("=", 1)[1]
    try:
        yield Running(proc, control, http, out)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@pytest.fixture
def upstream() -> Iterator[int]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def mounted_secrets(tmp_path: Path) -> Path:
    """A directory laid out as the egress-gateway-secrets Secret is mounted (0400 files)."""
    root = tmp_path / "etc-egress-secrets"
    root.mkdir()
    example = json.loads((DEPLOY / "examples" / "egress-gateway-secrets.json").read_text())
    for entry in example:  # the example's paths, moved under this directory
        entry["command"] = entry["command"].replace(mount("secrets"), str(root))
    (root / "secrets.json").write_text(json.dumps(example))
    (root / "openai-api-key").write_text("sk-test-" + os.urandom(8).hex())
    for f in root.iterdir():
        f.chmod(0o400)
    return root


def curl(http: str, url: str, user: str | None) -> str:
    argv = ["curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
            "-x", http.removeprefix("http://"), url]
    if user:
        argv[1:1] = ["--proxy-user", user]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(argv, capture_output=True, text=True, timeout=40, env=env,
                          check=False).stdout


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
    assert all("tenant" not in r for r in records)  # egress-proxy does not label them (yet)

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
