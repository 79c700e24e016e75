"""A gateway tenant's own command environment (``env`` on add; docs/gateway.md).

A real egress-proxy --control: a tenant whose token command is ``printenv``
gets the value from its own ``env`` and no other's; the frame's checks are pure.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from egress_proxyproc import start_proxy

from libegress.control import control_request
from libegress.control_frames import MAX_ENV, Add, BadFrame, parse_request


def _add(env: object) -> bytes:
    return json.dumps({"op": "add", "tenant": "t1", "env": env}).encode()


def test_env_is_read_and_every_bad_one_refused_without_its_value() -> None:
    got = parse_request(_add({"A": "1", "_B2": "x y=z"}))
    assert isinstance(got, Add) and got.env == {"A": "1", "_B2": "x y=z"}
    got = parse_request(json.dumps({"op": "add", "tenant": "t1"}).encode())
    assert isinstance(got, Add) and got.env is None
    secret = "sk-" + secrets.token_hex(8)
    for bad in ([secret], {"1A": secret}, {"A-B": secret}, {"A": 1}, {"A": secret + "\0"},
                {f"V{i}": secret for i in range(MAX_ENV + 1)}):
        with pytest.raises(BadFrame) as exc:
            parse_request(_add(bad))
        assert secret not in str(exc.value)


def test_a_tenants_token_command_runs_with_its_own_env(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    control = str(tmp_path / "c.sock")
    proxy = start_proxy(["--control", control], log=log)
    try:
        canary = "tok-" + secrets.token_hex(8)
        policy = {"token_command": "printenv GATEWAY_ENV_CANARY", "allow": ""}
        mine = control_request(control, {"op": "add", "tenant": "with-env", "policy": policy,
                                         "env": {"GATEWAY_ENV_CANARY": canary, "PATH":
                                                 "/usr/bin:/bin"}})
        other = control_request(control, {"op": "add", "tenant": "without", "policy": policy})
        assert mine["ok"] and other["ok"], (mine, other)
        deadline = time.monotonic() + 10
        while "tenant=without" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log.read_text()
        # The gateway's own environment has no such variable: printenv fails there only.
        failed = [line for line in text.splitlines() if "token renewal failed" in line]
        assert failed and all("tenant=without" in line for line in failed), text
        assert canary not in text
    finally:
        assert proxy.stop() == 0


def test_a_tenants_record_fifo_never_blocks_the_gateway(tmp_path: Path) -> None:
    """A FIFO nobody reads is refused at add; a stalled reader's lines drop, others go on."""
    import fcntl
    import os
    import subprocess
    import termios

    log = tmp_path / "proxy.log"
    control = str(tmp_path / "c.sock")
    proxy = start_proxy(["--control", control], log=log)
    try:
        fifo = tmp_path / "record.fifo"
        os.mkfifo(fifo, 0o600)
        refused = control_request(control, {"op": "add", "tenant": "noreader",
                                            "policy": {"record": str(fifo), "allow": ""}})
        assert refused["ok"] is False and "record" in refused["error"], refused
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read: it fills
        try:
            stalled = control_request(control, {"op": "add", "tenant": "stalled", "password":
                                                "p" * 32, "policy": {"record": str(fifo),
                                                                     "allow": ""}})
            assert stalled["ok"], stalled
            other = control_request(control, {"op": "add", "tenant": "other", "password":
                                              "q" * 32, "policy": {"allow": ""}})
            assert other["ok"], other
            url = proxy.http
            # Far more refusal lines than a pipe holds (each about 200 bytes).
            subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "60", "--proxy", url,
                            "--proxy-user", "stalled:" + "p" * 32,
                            "http://denied.invalid/[1-600]"], check=False)
            held = bytearray(4)
            fcntl.ioctl(reader, termios.FIONREAD, held)
            assert int.from_bytes(held, "little") >= 60000  # the pipe is full
            # The gateway still answers another tenant at once.
            done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                   "--max-time", "10", "--proxy", url, "--proxy-user",
                                   "other:" + "q" * 32, "http://denied.invalid/"],
                                  capture_output=True, text=True, check=False)
            assert done.stdout == "403", done
        finally:
            os.close(reader)
    finally:
        assert proxy.stop() == 0
