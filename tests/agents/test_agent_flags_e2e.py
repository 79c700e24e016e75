"""The real CLIs in sessions on both backends: ``--agent`` with other commands, and the
agents' own sandbox flags, translated (libbroker.launcher.agent_argv).

- ``--agent=NAME`` applies the profile (the private config copy and its
  variable) to ``bash -c`` and ``env`` without changing their argv; the agent
  itself starts (``--version``); these sessions are tenants of a resident
  service (``agent-sandbox serve``, one for the module), so the real CLIs start
  with the gateway's credential in their proxy variables;
- ``codex -s workspace-write`` / ``--full-auto`` / ``-s read-only`` and
  ``gemini -s`` run a turn whose shell tool writes the workdir: it is written,
  except under ``-s read-only``, where the session's workdir is read-only.
  Each says what it translated in one line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents_world import Home, need
from standin_apis import Apis

BACKENDS = ("bwrap", "nono")
AGENTS = ("claude", "codex", "gemini")
HOME_VAR = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME", "gemini": "GEMINI_CLI_HOME"}
WRITE = "RUN<<touch made.txt && echo WROTE-OK>>"


def session(w: Home, backend: str, *args: str, served: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    """A session; with ``served`` (the service's socket) a tenant of that service: no
    upstream_ca of its own then (the gateway trusts the stand-in's CA, as a whole)."""
    config = w.config(upstream_ca=None) if served else w.config()
    env = w.env(AGENT_SANDBOX_SERVE=str(served)) if served else w.env()
    return subprocess.run(
        ["agent-sandbox", "run", f"--config={config}", f"--sandbox={backend}", *args],
        env=env, cwd=w.workdir, capture_output=True, text=True, timeout=90,
        stdin=subprocess.DEVNULL, check=False,
    )


@pytest.fixture(scope="module")
def service(apis: Apis) -> Iterator[Path]:
    """One resident service for the module's tenants; its socket's path."""
    root = Path(tempfile.mkdtemp(prefix="as-serve-", dir="/tmp"))  # short: sun_path
    sock, log = root / "serve.sock", root / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX")}
    env["SSL_CERT_FILE"] = str(apis.ca_file)
    with log.open("w") as fh:
        proc = subprocess.Popen(["agent-sandbox", "serve", f"--socket={sock}"], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "serving:" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert proc.poll() is None, log.read_text()
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def ours(stderr: str) -> list[str]:
    """The launcher's own lines, but for the end-of-session refusal count (an agent's
    telemetry host refused, say: another test's subject) and the exported key's (the
    world exports every agent's)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("agent-sandbox:")
            and not re.search(r": agent-sandbox report( --propose)? \S+$", ln)
            and "stays on this host" not in ln]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agent", AGENTS)
def test_agent_profile_leaves_other_commands_as_typed(
    world: Home, service: Path, agent: str, backend: str
) -> None:
    need(agent)
    done = session(world, backend, f"--agent={agent}", "--", "bash", "-c", "echo hi",
                   served=service)
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    done = session(world, backend, f"--agent={agent}", "--", "env", served=service)
    assert done.returncode == 0, done.stderr
    env = dict(ln.split("=", 1) for ln in done.stdout.splitlines() if "=" in ln)
    # The profile applied: the agent's variable names the private copy, not the real config.
    assert "/agent-sandbox/agents/" in env[HOME_VAR[agent]], env
    # A tenant of the service: its credential in the proxy variables the agent reads.
    assert re.fullmatch(r"http://s[0-9a-f]{16}:[0-9a-f]{64}@127\.0\.0\.1:\d+/?",
                        env["HTTPS_PROXY"]), env["HTTPS_PROXY"]
    # The real CLI starts with it (Node's proxy setup reads the URL, userinfo and all).
    done = session(world, backend, "--", agent, "--version", served=service)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert ours(done.stderr) == [], done.stderr
    assert "tenant added" in done.stderr  # the gateway's line for this session's tenant


def turn(agent: str, flags: list[str]) -> list[str]:
    if agent == "codex":
        return ["codex", *flags, "exec", "--skip-git-repo-check", WRITE]
    return ["gemini", *flags, "--skip-trust", "--yolo", "-p", WRITE]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("agent", "flags", "writes"),
    [
        ("codex", ["-s", "workspace-write"], True),
        ("codex", ["--full-auto"], True),
        ("codex", ["--approve-for-me"], True),  # else its own sandbox nests and fails
        ("codex", ["-s", "read-only"], False),
        ("gemini", ["-s"], True),  # --sandbox, -ys: the same (tests/launcher/test_agent_argv.py)
    ],
)
def test_the_agents_own_sandbox_flags_are_translated(
    world: Home, backend: str, agent: str, flags: list[str], writes: bool
) -> None:
    need(agent)
    done = session(world, backend, "--", *turn(agent, flags))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT<<" in done.stdout, done.stdout + done.stderr[-2000:]
    lines = [ln for ln in ours(done.stderr) if "request" not in ln]  # not the proxy's summary
    assert len(lines) == 1 and f"{agent} {flags[0]}" in lines[0], done.stderr
    assert "cannot nest" in lines[0]
    assert (world.workdir / "made.txt").exists() is writes, done.stdout
    assert ("WROTE-OK" in done.stdout) is writes
    if not writes:
        assert "workdir is read-only" in lines[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_codex_started_by_a_shell_runs_without_its_own_sandbox(world: Home, backend: str) -> None:
    """No -c of ours on its command line: the copy's config.toml pins sandbox_mode."""
    need("codex")
    (world.home / ".codex" / "config.toml").write_text(
        'sandbox_mode = "read-only"\n' + (world.home / ".codex" / "config.toml").read_text())
    inner = f"codex exec --skip-git-repo-check '{WRITE}'"
    done = session(world, backend, "--agent=codex", "--", "bash", "-c", inner)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WROTE-OK" in done.stdout and (world.workdir / "made.txt").exists(), done.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trace_names_the_agents_steps(world: Home, backend: str) -> None:
    argv = ["agent-sandbox", "run", f"--config={world.config()}", f"--sandbox={backend}",
            "--agent=codex", "--", "true"]
    done = subprocess.run(argv, env=world.env(AGENT_SANDBOX_TRACE="1"), cwd=world.workdir,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    trace = [ln for ln in done.stderr.splitlines() if " trace " in ln]
    for step in ("codex's private config: 1 files", "codex's session settings written",
                 "codex's config written back", "where the time went: start"):
        assert any(step in ln for ln in trace), (step, done.stderr)
    assert not [ln for ln in ours(done.stderr)
                if " trace " not in ln]  # nothing notable left out: no line
