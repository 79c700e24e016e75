# agent-sandbox recipes.  `just setup demo` installs what running needs and shows a
# session; `just setup-dev lint test` is what CI runs.
set shell := ["bash", "-euo", "pipefail", "-c"]

# Everything the project installs stays in the checkout: the project's Python
# environment in .venv, the pinned agent CLIs in .agents (`rm -rf .venv .agents`
# undoes it).  Every recipe runs with .venv/bin first on PATH, so `python3`,
# `pytest`, `ruff` and the console scripts are the project environment's.
venv := justfile_directory() / ".venv"
agents_prefix := justfile_directory() / ".agents"
# The checkout on sys.path by a one-line .pth (setuptools' "compat" editable mode), not
# its import hook: the hook imports pathlib, urllib.parse and ipaddress in every
# interpreter with site, the launcher's among them (about 8 ms of CPU per session).
editable := "--config-settings editable_mode=compat"
export PATH := venv / "bin" + ":" + env_var("PATH")

# Debian packages a session needs: bubblewrap for the sandbox; gpg and git for
# signing; curl and ca-certificates for the demo and the proxy's CA bundle;
# procps, iproute2, util-linux for the tools the launcher calls; gcc and
# libc6-dev for gpg-shim's C fast path and the broker's reaper.
debs := "bubblewrap gnupg git curl ca-certificates procps iproute2 util-linux gcc libc6-dev"

# The coding agents tests/agents runs for real (Claude Code's 2.1.197 is the
# last tested; its newer releases want node >= 22, Debian has 20).  Installed
# into .agents, never over the user's own (`npm install -g` is not used).
agents := "@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 @google/gemini-cli@0.61.0"

default:
    @just --list

# What running needs: the Debian packages (as root), the project into .venv, the C helpers.
setup:
    @{{just_executable()}} _debs {{debs}}
    @[ -x "{{venv}}/bin/python" ] || { echo "setup: python3 -m venv {{venv}}"; python3 -m venv "{{venv}}"; }
    @echo "setup: pip install -e . into {{venv}} (the project and its 5 dependencies)"
    @"{{venv}}/bin/pip" install --disable-pip-version-check --progress-bar off {{editable}} -e . | { grep -E "^Successfully installed" || echo "setup: .venv already had them"; }
    @echo "setup: compiling the project's bytecode (as pip does for an installed package)"
    @"{{venv}}/bin/python" -m compileall -q bin libbroker libpolicy libegress deploy/kubernetes/controller >/dev/null || echo "setup: compileall failed; each start compiles what it imports" >&2
    @echo "setup: building gpg-shim's C fast path and the broker's reaper (libbroker/native)"
    @python3 -m libbroker.native || echo "setup: the C helpers did not build; git signs through the Python gpg-shim" >&2
    @echo "setup: done.  The commands are in {{venv}}/bin: export PATH=\"{{venv}}/bin:\$PATH\""

# setup, plus the test tools into .venv and the pinned agent CLIs into .agents.
setup-dev: setup
    @echo "setup-dev: pip install -e '.[test]' into {{venv}} (pytest, hypothesis, trustme, mypy, ruff, type stubs)"
    @"{{venv}}/bin/pip" install --disable-pip-version-check --progress-bar off {{editable}} -e '.[test]' | { grep -E "^Successfully installed" || echo "setup-dev: .venv already had them"; }
    @command -v kubectl >/dev/null || {{just_executable()}} _debs kubectl || echo "setup-dev: kubectl not installable here; its tests will be skipped" >&2
    @command -v npm >/dev/null || {{just_executable()}} _debs nodejs npm || echo "setup-dev: npm not installable here; the agent tests will be skipped" >&2
    @echo "setup-dev: npm install --prefix {{agents_prefix}} {{agents}}"
    @npm install --prefix "{{agents_prefix}}" --no-fund --no-audit --loglevel=error {{agents}} || echo "setup-dev: the agent CLIs did not install; tests/agents will skip them" >&2
    @echo "setup-dev: .agents/node_modules/.bin: $(ls "{{agents_prefix}}/node_modules/.bin" 2>/dev/null | tr '\n' ' ')"

# Install the named Debian packages that are missing (as root; otherwise say which).
_debs +PKGS:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    for p in {{PKGS}}; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && exit 0
    if [ "$(id -u)" != 0 ]; then
        echo "setup: not root, so not installed (ask root for them; doctor says what each costs): ${missing[*]}" >&2
        exit 0
    fi
    echo "setup: apt-get install ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"

# The whole test suite (real processes, sockets, sandboxes), with .venv's python.
test *ARGS:
    python3 -m pytest -q {{ARGS}}

# ruff and mypy --strict over the libraries and bin/.
lint:
    ruff check .
    mypy

# Extra tools the benchmarks compare against (tinyproxy, mitmproxy, srt in .bench/: never global).
bench-setup:
    {{just_executable()}} _debs tinyproxy hyperfine ripgrep socat || echo "bench-setup: tinyproxy, hyperfine, ripgrep or socat unavailable; those comparisons are skipped (srt needs ripgrep and socat)" >&2
    # mitmproxy pins older h11/cryptography: keep it in its own venv, never in ours.
    [ -x .venv-mitmproxy/bin/mitmdump ] || { python3 -m venv .venv-mitmproxy && .venv-mitmproxy/bin/pip install -q mitmproxy; } || echo "bench-setup: mitmproxy unavailable; its comparison is skipped" >&2
    [ -x .bench/node_modules/.bin/srt ] || npm install --prefix .bench --no-fund --no-audit @anthropic-ai/sandbox-runtime >/dev/null || echo "bench-setup: srt unavailable; the session-start comparison is skipped" >&2
    pip install --disable-pip-version-check --progress-bar off atheris | { grep -E "^Successfully installed" || true; } || echo "bench-setup: atheris unavailable; its fuzzing is skipped" >&2

# Every benchmark, each printing its figures side by side with its baseline.
bench:
    for b in broker hook sign egress egress_mitm egress_repos gateway launcher bridges serve limits hostrun hostrun_live git agents; do if [ -f bench/$b.py ]; then echo "== bench/$b.py"; python3 bench/$b.py; fi; done

# Load, fault, fuzz and attack runs; report in bench/results/stress.md.
stress *ARGS:
    python3 bench/stress.py {{ARGS}}

# A sandboxed session with the built-in default policy: what the sandbox sees.
demo:
    @agent-sandbox run -- sh -c 'echo "inside: AGENT_SANDBOX=$AGENT_SANDBOX, workdir $(pwd)"; echo "home ($HOME) shows only: $(ls -A "$HOME" 2>/dev/null | tr "\n" " ")"; curl -s -o /dev/null -w "example.com (not allowed): CONNECT answered %{http_connect} by the egress proxy\n" https://example.com/; broker-client -- sh -c "echo brokered command ran, exit status comes back"'

# Any command in a sandboxed session: `just run bash`, `just run make test`.
run +CMD:
    agent-sandbox run -- {{CMD}}
