# agent-sandbox developer recipes.  `just setup test` is what CI runs.
set shell := ["bash", "-euo", "pipefail", "-c"]

# Debian packages the tools and tests use (bubblewrap for the sandbox; gpg, git,
# curl, kubectl as real clients in the tests; gcc for gpg-shim's C fast path).
debs := "bubblewrap gnupg git curl ca-certificates procps iproute2 util-linux gcc libc6-dev"

# The coding agents tests/agents runs for real (Claude Code's 2.1.197 is the
# last tested; its newer releases want node >= 22, Debian has 20).
agents := "@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 @google/gemini-cli@0.61.0"

default:
    @just --list

# Install system packages (as root) and the project with its test extras.
setup:
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {{debs}} >/dev/null; fi
    command -v kubectl >/dev/null || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null; } || echo "setup: kubectl not installable here; its tests will be skipped" >&2
    pip install -q --disable-pip-version-check -e '.[test]'
    # The real agents for tests/agents (pinned; Node.js from Debian when missing).
    command -v npm >/dev/null || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; } || echo "setup: npm not installable here; the agent tests will be skipped" >&2
    npm install -g --no-fund --no-audit --loglevel=error {{agents}} >/dev/null 2>&1 || echo "setup: the agent CLIs did not install; tests/agents will skip them" >&2
    python3 -m libbroker.native || echo "setup: gpg-shim's C fast path not built; git signs through the Python gpg-shim" >&2
    command -v pyenv >/dev/null && pyenv rehash || true

# The whole test suite (real processes, sockets, sandboxes).
test *ARGS:
    python3 -m pytest -q {{ARGS}}

# ruff and mypy --strict over the libraries and bin/.
lint:
    ruff check .
    mypy

# Extra tools the benchmarks compare against (tinyproxy, mitmproxy).
bench-setup:
    if [ "$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tinyproxy hyperfine >/dev/null; fi
    # mitmproxy pins older h11/cryptography: keep it in its own venv, never in ours.
    [ -x .venv-mitmproxy/bin/mitmdump ] || { python3 -m venv .venv-mitmproxy && .venv-mitmproxy/bin/pip install -q mitmproxy; } || echo "bench-setup: mitmproxy unavailable; its comparison is skipped" >&2
    pip install -q --disable-pip-version-check atheris || echo "bench-setup: atheris unavailable; its fuzzing is skipped" >&2

# Every benchmark, each printing its figures side by side with its baseline.
bench:
    for b in broker hook sign egress egress_repos launcher limits; do if [ -f bench/$b.py ]; then echo "== bench/$b.py"; python3 bench/$b.py; fi; done

# Load, fault, fuzz and attack runs; report in bench/results/stress.md.
stress *ARGS:
    python3 bench/stress.py {{ARGS}}

# A sandboxed session with the built-in default policy: what the sandbox sees.
demo:
    @agent-sandbox run -- sh -c 'echo "inside: AGENT_SANDBOX=$AGENT_SANDBOX, workdir $(pwd)"; echo "home ($HOME) shows only: $(ls -A "$HOME" 2>/dev/null | tr "\n" " ")"; curl -s -o /dev/null -w "example.com (not allowed): CONNECT answered %{http_connect} by the egress proxy\n" https://example.com/; broker-client -- sh -c "echo brokered command ran, exit status comes back"'

# Any command in a sandboxed session: `just run bash`, `just run make test`.
run +CMD:
    agent-sandbox run -- {{CMD}}
