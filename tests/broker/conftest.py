"""Helpers for the broker tests: a real broker-server, real broker-client runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

BIN = os.path.dirname(sys.executable)
SERVER = os.path.join(BIN, "broker-server")
CLIENT = os.path.join(BIN, "broker-client")
SECRET = "broker-test-secret-value-7f3a"


@dataclass
class Broker:
    backend: str
    socket: str
    workdir: str
    audit: str
    proc: subprocess.Popen[str]

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=self.socket)
        env["PATH"] = BIN + ":" + env.get("PATH", "/usr/bin:/bin")
        return env

    def sh(
        self, script: str, *, timeout: float = 30, **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a bash pipeline in the workdir with broker-client on PATH."""
        return subprocess.run(
            ["bash", "-c", script], cwd=self.workdir, env=self.env, capture_output=True,
            timeout=timeout, **kw,  # type: ignore[arg-type]
        )  # fmt: skip


def start_server(
    backend: str, workdir: str, sock: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [SERVER, f"--socket={sock}", f"--workdir={workdir}", f"--sandbox={backend}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening unix:"):
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"broker-server did not start: {line!r} {err}")
    return proc


def stop_server(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def broker_for(backend: str) -> Iterator[Broker]:
    base = tempfile.mkdtemp(prefix="brk-")
    workdir = os.path.join(base, "work")
    os.mkdir(workdir)
    sock = os.path.join(base, "s")
    audit = os.path.join(base, "audit.jsonl")
    env = dict(os.environ, BROKER_TEST_SECRET=SECRET, NONO_BLOCK_NET="0")
    proc = start_server(backend, workdir, sock, f"--audit={audit}", env=env)
    try:
        yield Broker(backend, sock, workdir, audit, proc)
    finally:
        stop_server(proc)
        shutil.rmtree(base, ignore_errors=True)



@pytest.fixture(scope="module", params=["nono", "bwrap"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A running broker-server per backend, shared by a module's tests."""
    yield from broker_for(request.param)


def running(text: str) -> list[int]:
    """Pids of live processes whose command line holds ``text`` (a zombie's is empty)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if text.encode() in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def _until(text: str, want_any: bool, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while bool(found := running(text)) != want_any and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def started(text: str, within: float = 10.0) -> list[int]:
    """:func:`running` once something matches, or [] after ``within`` seconds."""
    return _until(text, True, within)


def gone(text: str, within: float = 10.0) -> list[int]:
    """:func:`running` once nothing matches ([]), or what still runs after ``within`` s."""
    return _until(text, False, within)


@dataclass
class Tools:
    start_server = staticmethod(start_server)
    stop_server = staticmethod(stop_server)
    running = staticmethod(running)
    started = staticmethod(started)
    gone = staticmethod(gone)
    server = SERVER
    client = CLIENT
    secret = SECRET


@pytest.fixture
def tools() -> Tools:
    """The helpers above, for test modules (importlib mode: no sibling imports)."""
    return Tools()
