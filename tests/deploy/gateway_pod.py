"""The gateway pod as tests/deploy runs it: the Deployment's argv on loopback, its
containers and mounts read from the YAML, a stand-in upstream, curl through it."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import DEPLOY

DEPLOYMENT = DEPLOY / "base" / "gateway-deployment.yaml"


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    return spec


def container(name: str = "egress-proxy") -> dict[str, Any]:
    [c] = [c for c in pod_spec()["containers"] if c["name"] == name]
    return c


def mount(name: str, of: str = "egress-proxy") -> str:
    [path] = [m["mountPath"] for m in container(of)["volumeMounts"] if m["name"] == name]
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
    with running(tmp_path) as gw:
        yield gw


@contextlib.contextmanager
def running(tmp_path: Path) -> Iterator[Running]:
    """The gateway container's entry command, on loopback, until the block ends."""
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
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
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
