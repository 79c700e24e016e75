"""The real agent CLIs (Claude Code, Codex, Gemini CLI) against stand-in APIs: the world.

Helpers and fixtures: a module-wide stand-in (standin_apis.py), and per test
a fresh home holding a fake ssh key and each agent's API-key login, a workdir,
a config that pins the APIs' hosts to the stand-in.  The CLIs are the pinned
ones ``just setup-dev`` installs into the checkout's ``.agents`` (never the
user's own, whatever version PATH finds); an agent not installed there is
skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from standin_apis import HOSTS, Apis, start

SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- agents-test-secret"
# Where `just setup-dev` puts the pinned agent CLIs (npm install --prefix .agents).
AGENTS_BIN = Path(__file__).resolve().parents[2] / ".agents" / "node_modules" / ".bin"
KEYS = {"claude": "ANTHROPIC_API_KEY", "codex": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}


@pytest.fixture(scope="session")
def apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apis]:
    found, server = start(tmp_path_factory.mktemp("agent-apis"))
    yield found
    server.shutdown()
    server.server_close()


def installed(agent: str) -> str | None:
    """The pinned CLI in .agents, or None: never one found elsewhere on PATH."""
    return shutil.which(agent, path=str(AGENTS_BIN))


def need(agent: str) -> str:
    path = installed(agent)
    if path is None:
        pytest.skip(f"{agent} CLI not installed in {AGENTS_BIN} (just setup-dev installs it)")
    return path


@dataclass
class Home:
    root: Path
    home: Path
    workdir: Path
    apis: Apis
    mark: str
    # Gemini CLI relaunches itself as a child node with a bigger heap unless
    # GEMINI_CLI_NO_RELAUNCH is set (the child always runs with it set, so what
    # the agent does is the same either way): one node start instead of two,
    # seconds per run.  The test that keeps the real relaunch, on both backends,
    # sets this (test_login_inside_e2e.py: a login made inside, a turn after it).
    gemini_relaunch: bool = False

    def config(self, **extra: object) -> Path:
        keys: dict[str, object] = {
            "workdir": str(self.workdir),
            "token_command": "",
            "resolve": [f"{h}:127.0.0.1:{self.apis.port}" for h in HOSTS],
            "upstream_ca": str(self.apis.ca_file),
            # The exported keys reach the APIs through egress-proxy (exported_keys.py).
            "start_timeout": 60,
        }
        passed = list(extra.pop("env", None) or [])  # the caller's, then ours
        if not self.gemini_relaunch:
            passed.append("GEMINI_CLI_NO_RELAUNCH")
        if passed:
            keys["env"] = passed
        keys.update(extra)  # a key given as None is left out
        path = self.root / "config.toml"
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()
                                if v is not None))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("XDG_", "AGENT_SANDBOX", "ANTHROPIC", "OPENAI", "GEMINI", "CODEX"))
            and k not in ("CLAUDE_CONFIG_DIR", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE")
        }
        ca = str(self.apis.ca_file)
        env.update(HOME=str(self.home), NODE_EXTRA_CA_CERTS=ca, SSL_CERT_FILE=ca)
        # The pinned CLIs first, in the session and on the host alike.
        env["PATH"] = f"{AGENTS_BIN}:{env.get('PATH', os.defpath)}"
        env.update({v: f"test-key-{k}" for k, v in KEYS.items()})
        env["AS_TEST_MARK"] = self.mark
        if not self.gemini_relaunch:
            env["GEMINI_CLI_NO_RELAUNCH"] = "true"
        env.update(extra)
        return env

    def session(
        self, backend: str, *cmd: str, timeout: float = 90, **env: str
    ) -> subprocess.CompletedProcess[str]:
        argv = ["agent-sandbox", "run", f"--config={self.config()}", f"--sandbox={backend}"]
        return subprocess.run(
            [*argv, "--", *cmd],
            env=self.env(**env),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def host(self, *cmd: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """A plain run on the host, outside any session, against the stand-in."""
        return subprocess.run(
            list(cmd),
            env=self.env(**env),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )


def _logins(home: Path) -> None:
    """Each agent set up as a user with an API key would have it."""
    (home / ".claude").mkdir()
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(
        'model_provider = "standin"\nmodel = "gpt-standin"\n'
        "check_for_update_on_startup = false\n\n"
        "[model_providers.standin]\n"
        'name = "standin"\nbase_url = "https://api.openai.com/v1"\n'
        'env_key = "OPENAI_API_KEY"\nwire_api = "responses"\nsupports_websockets = false\n'
    )
    (home / ".gemini").mkdir()
    (home / ".gemini" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}})
    )


@pytest.fixture()
def world(tmp_path: Path, apis: Apis) -> Iterator[Home]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SSH_KEY + "\n")
    _logins(home)
    # Short, so the runtime dir's sockets fit in sun_path.
    workdir = Path(tempfile.mkdtemp(prefix="as-agent-", dir="/tmp"))
    w = Home(tmp_path, home, workdir, apis, mark=f"as-agent-{uuid.uuid4().hex}")
    yield w
    shutil.rmtree(workdir, ignore_errors=True)
