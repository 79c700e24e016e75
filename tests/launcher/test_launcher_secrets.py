"""[[secret]] tables: parsed and checked, handed to egress-proxy, a placeholder inside.

The session test is real: the launcher, egress-proxy with --secrets, a sandbox,
and an api.anthropic.com stand-in with its own CA that records what it got.
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme
from launcher_world import World

from libbroker.errors import ConfigError, LaunchError
from libbroker.launcher import agent_sandbox, config, plan, runtime_dir
from libbroker.launcher.config import SECRET_PLACEHOLDER, HostFacts, from_mapping
from libbroker.launcher.runtime import Runtime

FACTS = HostFacts(home="/home/u", cwd="/home/u/work", gh_present=False)
REAL = "sk-ant-" + secrets.token_hex(8) + "-REALKEY"
ENTRY = {"host": "api.anthropic.com", "header": "x-api-key", "format": "{}",
         "command": "cat /home/u/.config/anthropic-key", "every": 120,
         "env": "ANTHROPIC_API_KEY"}


def test_a_secret_table_is_parsed_and_its_host_allowed() -> None:
    cfg = from_mapping({"secret": [ENTRY, {"host": "api.openai.com", "header": "Authorization",
                                           "command": "pass openai"}],
                        "domains": ["pypi.org"]}, FACTS)
    assert cfg.secrets[0] == config.Secret("api.anthropic.com", "x-api-key",
                                           "cat /home/u/.config/anthropic-key", "{}", 120,
                                           "ANTHROPIC_API_KEY")
    assert cfg.secrets[1].format == "Bearer {}" and cfg.secrets[1].every == 300
    assert cfg.secrets[1].env == ""
    assert cfg.domains == ("pypi.org", "api.anthropic.com", "api.openai.com")


@pytest.mark.parametrize(("entry", "message"), [
    ({**ENTRY, "colour": "red"}, "unknown key 'colour'"),
    ({k: v for k, v in ENTRY.items() if k != "host"}, "missing key 'host'"),
    ({k: v for k, v in ENTRY.items() if k != "header"}, "missing key 'header'"),
    ({k: v for k, v in ENTRY.items() if k != "command"}, "missing key 'command'"),
    ({**ENTRY, "format": "Bearer"}, "'format' must contain {} exactly once"),
    ({**ENTRY, "every": 0}, "'every' must be a positive number"),
    ({**ENTRY, "every": "5"}, "'every' must be a positive number"),
    ({**ENTRY, "every": 1.5}, "'every' must be a whole number"),
    ({**ENTRY, "header": "Host"}, "'header' 'Host' is a field the proxy may not set"),
    ({**ENTRY, "header": "x key"}, "'header' is not a valid header name"),
    ({**ENTRY, "command": "cat 'unclosed"}, "'command' cannot be split"),
    ({**ENTRY, "host": "127.0.0.1"}, "must be a DNS name, not an address"),
    ({**ENTRY, "env": "1BAD"}, "not a variable name"),
    ({**ENTRY, "env": "GH_TOKEN"}, "may not be passed"),
    ({**ENTRY, "host": "*.anthropic.com"}, "'host' is not a valid host name"),
    ({**ENTRY, "host": "github.com"}, "is an inject host"),
])
def test_a_bad_secret_table_is_refused(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping({"secret": [entry]}, FACTS)


def test_duplicate_hosts_and_envs_are_refused() -> None:
    with pytest.raises(ConfigError, match="has a \\[\\[secret\\]\\] already"):
        from_mapping({"secret": [ENTRY, {**ENTRY, "env": "OTHER", "host": "API.anthropic.com"}]},
                     FACTS)
    with pytest.raises(ConfigError, match="another secret's"):
        from_mapping({"secret": [ENTRY, {**ENTRY, "host": "api.openai.com"}]}, FACTS)
    with pytest.raises(ConfigError, match="secret: must be \\[\\[secret\\]\\] tables"):
        from_mapping({"secret": {"host": "x"}}, FACTS)


def test_the_proxy_gets_the_file_and_the_sandbox_the_placeholder() -> None:
    cfg = from_mapping({"secret": [ENTRY], "env": ["ANTHROPIC_API_KEY"],
                        "unsafe_env": ["ANTHROPIC_API_KEY"]}, FACTS)
    rt = Runtime("/run/user/1/agent-sandbox/session-x")
    assert ("--secrets=/run/user/1/agent-sandbox/session-x.host/secrets.json"
            in plan.proxy_args(cfg, rt))
    assert json.loads(plan.secrets_json(cfg)) == [
        {k: v for k, v in ENTRY.items() if k != "env"}]
    env = agent_sandbox.environment(cfg, rt, {"ANTHROPIC_API_KEY": REAL, "PATH": "/usr/bin"},
                                    bin_dir="/b", http_port=1, socks_port=2)
    assert env["ANTHROPIC_API_KEY"] == SECRET_PLACEHOLDER
    assert REAL not in json.dumps(env)
    no_secret = from_mapping({}, FACTS)
    assert not any(a.startswith("--secrets") for a in plan.proxy_args(no_secret, rt))


# --- a real session ----------------------------------------------------------------


class _Anthropic(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    seen: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        record = {"host": self.headers.get("Host"), "x-api-key": self.headers.get_all("x-api-key")}
        self.seen.append(record)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def anthropic(tmp_path: Path) -> Iterator[tuple[int, Path, list[dict[str, Any]]]]:
    ca = trustme.CA()
    ca_file = tmp_path / "anthropic-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("api.anthropic.com").configure_cert(ctx)
    seen: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Anthropic,), {"seen": seen}))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield server.server_address[1], ca_file, seen
    server.shutdown()
    server.server_close()


INSIDE = r"""
echo "env=$ANTHROPIC_API_KEY"
echo "answer=$(curl -sS --max-time 20 https://api.anthropic.com/v1/messages \
    -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}')"
rt="$(dirname "$AGENT_SANDBOX_POLICY")"
echo "secrets_in_runtime=$(ls -a "$rt" | grep -c secrets)"
echo "secrets_host_only=$(cat "$rt.host/secrets.json" 2>/dev/null | wc -c)\
$(ls "$rt.host" 2>/dev/null | wc -l)"
echo "secrets_anywhere=$(grep -rls --exclude-dir=proc --exclude-dir=sys "$KEYFILE" \
    "$rt" "$rt.host" "$(dirname "$rt")" /tmp 2>/dev/null | wc -l)"
echo "leak=$(env | grep -c "$PROBE")"
"""


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_session_holds_the_placeholder_and_the_stand_in_gets_the_key(
    world: World, anthropic: tuple[int, Path, list[dict[str, Any]]], backend: str,
) -> None:
    port, ca_file, seen = anthropic
    key_file = world.home / ".config" / "anthropic-key"
    key_file.write_text(REAL + "\n")
    both = world.root / "upstream-cas.pem"
    both.write_bytes(world.standin.ca_file.read_bytes() + ca_file.read_bytes())
    cfg = world.config(
        upstream_ca=str(both),
        resolve=[f"github.com:127.0.0.1:{world.standin.port}",
                 f"api.github.com:127.0.0.1:{world.standin.port}",
                 f"api.anthropic.com:127.0.0.1:{port}"],
        env=["ANTHROPIC_API_KEY"],  # passed through, and still the placeholder wins
        unsafe_env=["ANTHROPIC_API_KEY"],  # (env alone refuses a key variable since issue 27)
    )
    with cfg.open("a") as fh:
        fh.write(f'\n[[secret]]\nhost = "api.anthropic.com"\nheader = "x-api-key"\n'
                 f'format = "{{}}"\ncommand = "cat {key_file}"\nenv = "ANTHROPIC_API_KEY"\n')
    # The host's own value of the variable must not get in either.
    env = world.env(ANTHROPIC_API_KEY=REAL)
    mid = len(REAL) // 2
    probe = REAL[:mid] + "[" + REAL[mid] + "]" + REAL[mid + 1:]
    done = world.run("sh", "-c", f"PROBE='{probe}'\nKEYFILE='{key_file}'\n" + INSIDE,
                     config=cfg, sandbox=backend, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    out = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert out["env"] == SECRET_PLACEHOLDER
    assert json.loads(out["answer"]) == {"ok": True}, done.stderr
    assert seen[-1] == {"host": "api.anthropic.com", "x-api-key": [REAL]}
    # The --secrets file (it names the key's command) is in no directory the
    # sandbox can read: not the runtime dir, not its host-only sibling.
    assert out["secrets_in_runtime"] == "0"
    assert out["secrets_host_only"] == "00"
    assert out["secrets_anywhere"] == "0"
    assert out["leak"] == "0"
    assert REAL not in done.stdout + done.stderr
    assert world.leftovers() == []


def test_the_secrets_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    runtime_dir.write_private(str(path), "[]")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


# --- agent-sandbox doctor ----------------------------------------------------------


def test_doctor_runs_each_secret_command_once_and_never_shows_its_value(tmp_path: Path) -> None:
    from libbroker.launcher import doctor

    counter = tmp_path / "runs"
    entries = [
        {**ENTRY, "host": "api.anthropic.com",
         "command": f"sh -c 'echo run >> {counter}; echo {REAL}'"},
        {**ENTRY, "host": "api.openai.com", "env": "OPENAI_API_KEY",
         "command": f"sh -c 'echo {REAL}; exit 3'"},
        {**ENTRY, "host": "one.test", "env": "ONE", "command": "true"},
        {**ENTRY, "host": "two.test", "env": "TWO", "command": f"echo 'two words {REAL}'"},
        {**ENTRY, "host": "three.test", "env": "THREE",
         "command": f"/nonexistent/{REAL}"},
    ]
    cfg = from_mapping({"secret": entries}, FACTS)
    found = doctor.check_secrets(cfg)
    assert [c.level for c in found] == [doctor.OK, doctor.WARN, doctor.WARN, doctor.WARN,
                                        doctor.WARN]
    assert "prints a value" in found[0].what and "api.anthropic.com" in found[0].what
    assert "exit 3" in found[1].what
    assert counter.read_text() == "run\n"
    text = "\n".join(c.line() for c in found)
    assert REAL not in text
    assert all("[[secret]]" in c.fix for c in found[1:])


def test_the_users_ca_file_is_bundled_after_the_sessions_ca(tmp_path: Path) -> None:
    """SSL_CERT_FILE and NODE_EXTRA_CA_CERTS: the session's bundle, a newline, then the
    user's file, byte for byte, in new files of the runtime dir (0644)."""
    from libbroker.launcher import agent_session

    rt = Runtime(str(tmp_path / "rt"))
    os.makedirs(rt.egress_dir)
    (Path(rt.egress_dir) / "bundle.pem").write_bytes(b"ROOTS\n" * 50000 + b"OURS")
    (Path(rt.egress_dir) / "ca.pem").write_bytes(b"OURS-CA")
    user = tmp_path / "user.pem"
    user.write_bytes(b"USER\n" * 70000)
    env = {"SSL_CERT_FILE": str(user), "NODE_EXTRA_CA_CERTS": str(user)}
    agent_session.write_cas(rt, env)
    ssl, node = Path(rt.root) / "ssl-bundle.pem", Path(rt.root) / "node-ca.pem"
    assert ssl.read_bytes() == b"ROOTS\n" * 50000 + b"OURS" + b"\n" + b"USER\n" * 70000
    assert node.read_bytes() == b"OURS-CA\n" + b"USER\n" * 70000
    assert ssl.stat().st_mode & 0o777 == 0o644
    with pytest.raises(LaunchError, match="cannot bundle"):  # never over an existing file
        agent_session.write_cas(rt, env)
