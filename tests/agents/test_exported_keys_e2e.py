"""Exported API keys, the real agents: each works with only its exported variable,
and the key is nowhere inside the session (files, environment, /proc).

The variable is exported to the launcher and nowhere in the config: the
launcher makes it a secret of egress-proxy's (libbroker.launcher.exported_keys),
the stand-in API gets the real key, the session a placeholder.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest
from agents_world import KEYS, Home, need
from inside_scan import SCAN, report, split
from test_agents_e2e import agent_argv

BACKENDS = ("bwrap", "nono")
AGENTS = ("claude", "codex", "gemini")


def run(w: Home, backend: str, env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess[str]:
    argv = ["agent-sandbox", "run", f"--config={w.config()}", f"--sandbox={backend}", "--"]
    return subprocess.run([*argv, *cmd], env=w.env(**env), cwd=w.workdir, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agent", AGENTS)
def test_an_exported_key_works_and_stays_outside(world: Home, agent: str, backend: str) -> None:
    need(agent)
    w = world
    var = KEYS[agent]
    w.apis.seen.clear()  # the stand-in serves the whole module
    key = f"sk-exported-{uuid.uuid4().hex}"
    (w.workdir / "scan.py").write_text(
        SCAN.format(parts=split(key)) + f"print('INSIDE', os.environ.get({var!r}))\n")
    done = run(w, backend, {var: key}, *agent_argv(agent, "RUN<<python3 scan.py>>"))
    out = done.stdout
    report(f"api-key {agent} {backend} turn", out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT<<" in out and "SCANNED" in out, out + done.stderr[-2000:]
    assert "FOUND" not in out, out
    assert "INSIDE agent-sandbox-placeholder" in out, out
    host = {"claude": "api.anthropic.com", "codex": "api.openai.com",
            "gemini": "generativelanguage.googleapis.com"}[agent]
    assert (f"agent-sandbox: {var} stays on this host: egress-proxy sends it to {host} "
            "(the session sees a placeholder)") in done.stderr
    assert key not in done.stderr + out
    # Every model request carried the real key, set by egress-proxy.
    sent = [s.auth for s in w.apis.seen if s.host.startswith(host) and s.body]
    assert sent and all(key in a for a in sent), sent


def test_a_key_listed_in_env_is_refused_without_the_opt_in(world: Home) -> None:
    cfg = world.config(env=["ANTHROPIC_API_KEY"])
    done = subprocess.run(["agent-sandbox", "run", f"--config={cfg}", "--", "true"],
                          env=world.env(), cwd=world.workdir, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "name it in unsafe_env too" in done.stderr
    assert "test-key" not in done.stderr
