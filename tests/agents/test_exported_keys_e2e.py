"""Exported API keys: one listed in the config's ``env`` is refused without the opt-in.

That each real agent works with only its exported variable, and the key is
nowhere inside the session (files, environment, /proc), is checked in the
session of test_agents_e2e.py (per agent and backend: one session, several checks).
"""

from __future__ import annotations

import subprocess

from agents_world import Home


def test_a_key_listed_in_env_is_refused_without_the_opt_in(world: Home) -> None:
    cfg = world.config(env=["ANTHROPIC_API_KEY"])
    done = subprocess.run(["agent-sandbox", "run", f"--config={cfg}", "--", "true"],
                          env=world.env(), cwd=world.workdir, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "name it in unsafe_env too" in done.stderr
    assert "test-key" not in done.stderr
