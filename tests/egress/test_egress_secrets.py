"""--secrets: any host's credential set at the proxy, the client holding a placeholder.

A real egress-proxy, stand-in upstreams with their own CA (reached through
--resolve and --upstream-ca) and curl trusting the proxy's CA from --egress-dir.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from egress_proxyproc import ProxyProc, start_proxy
from egress_upstreams import Upstream, serve_once, start
from egress_world import require

from libegress.ca import issue_leaf, make_authority, server_context
from libegress.secrets import parse_secrets

REAL = "sk-ant-REAL0123456789secretvalue"
BEARER = "sk-proj-BEARER9876543210value"
BASIC = "ghp_BASIC0123456789value"
FAILING = "failing-VALUE-printed-before-exit-3"
TOKEN = "ghs_GITHUBTOKEN0123456789"
PLACEHOLDER = "agent-sandbox-placeholder"
SECRETS = (REAL, BEARER, BASIC, FAILING, TOKEN)


@dataclass
class Rig:
    tmp: Path
    proxy: ProxyProc
    egress: Path
    anthropic: Upstream
    openai: Upstream
    gitlike: Upstream
    github: Upstream
    other: Upstream
    real_file: Path


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    require("curl")
    tmp = tmp_path_factory.mktemp("secrets")
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert("api.anthropic.com", "api.openai.com", "git.example.test",
                         "api.github.com", "other.test", "failing.test")
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ups = {name: start("echo", str(cert_file), str(key_file))
           for name in ("anthropic", "openai", "gitlike", "github", "other")}
    real_file = tmp / "real"
    real_file.write_text(REAL + "\n")
    (tmp / "token").write_text(TOKEN + "\n")
    secrets = [
        # The first value comes after a second: `listening` waits for it.
        {"host": "api.anthropic.com", "header": "x-api-key", "format": "{}",
         "command": f"sh -c 'sleep 1; cat {real_file}'", "every": 1},
        {"host": "api.openai.com", "header": "Authorization", "command": f"echo {BEARER}"},
        {"host": "git.example.test", "header": "Authorization",
         "format": "Basic x-access-token:{}", "command": f"echo {BASIC}", "every": 300},
        # Prints a value, then fails: nothing of it may be held or logged.
        {"host": "failing.test", "header": "x-key", "command": f"sh -c 'echo {FAILING}; exit 3'",
         "every": 1},
    ]
    secrets_file = tmp / "secrets.json"
    secrets_file.write_text(json.dumps(secrets))
    egress = tmp / "egress"
    pins = [f"{host}:127.0.0.1:{ups[name].port}" for host, name in (
        ("api.anthropic.com", "anthropic"), ("api.openai.com", "openai"),
        ("git.example.test", "gitlike"), ("api.github.com", "github"),
        ("other.test", "other"), ("failing.test", "other"))]
    args = ["--secrets", str(secrets_file), "--inject", "api.github.com",
            "--token-command", f"cat {tmp / 'token'}", "--allow", f"other.test:{ups['other'].port}",
            "--upstream-ca", str(ca_file), "--egress-dir", str(egress)]
    for pin in pins:
        args += ["--resolve", pin]
    proxy = start_proxy(args, log=tmp / "proxy.log")
    proxy.egress_dir = egress
    rig = Rig(tmp, proxy, egress, ups["anthropic"], ups["openai"], ups["gitlike"],
              ups["github"], ups["other"], real_file)
    # The first request after `listening` already carries the slow first value.
    first = curl(rig, "https://api.anthropic.com/v1/first")
    assert first.returncode == 0, first.stderr
    assert header_values(rig.anthropic, "x-api-key") == [REAL]
    yield rig
    assert proxy.stop() == 0
    for up in ups.values():
        up.stop()


def curl(rig: Rig, url: str, *headers: str, cafile: str = "ca.pem",
         extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = ["curl", "-sS", "--max-time", "15", "-x", rig.proxy.http,
            "--cacert", str(rig.egress / cafile), *extra]
    for h in headers:
        argv += ["-H", h]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([*argv, url], capture_output=True, text=True, check=False,
                          timeout=30, env=env)


def header_values(up: Upstream, name: str, index: int = -1) -> list[str]:
    headers = up.seen[index]["headers"]
    return [v for k, v in headers if k.lower() == name.lower()]


def test_the_stand_in_gets_the_real_key_not_the_placeholder(rig: Rig) -> None:
    out = curl(rig, "https://api.anthropic.com/v1/messages", f"x-api-key: {PLACEHOLDER}",
               "X-Api-Key: second-client-value", "Authorization: Bearer client-own",
               "Proxy-Authorization: Basic Zm9vOmJhcg==")
    assert out.returncode == 0, out.stderr
    assert header_values(rig.anthropic, "x-api-key") == [REAL]
    assert header_values(rig.anthropic, "authorization") == []
    assert not [k for k, _ in rig.anthropic.seen[-1]["headers"] if k.lower().startswith("proxy-")]
    assert json.loads(out.stdout)["host"] == "api.anthropic.com"


def test_bearer_is_the_default_format(rig: Rig) -> None:
    out = curl(rig, "https://api.openai.com/v1/models", f"Authorization: Bearer {PLACEHOLDER}")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["authorization"] == [f"Bearer {BEARER}"]


def test_the_basic_form_is_base64_as_git_expects(rig: Rig) -> None:
    out = curl(rig, "https://git.example.test/o/r.git/info/refs")
    assert out.returncode == 0, out.stderr
    pair = base64.b64encode(f"x-access-token:{BASIC}".encode()).decode()
    assert json.loads(out.stdout)["authorization"] == [f"Basic {pair}"]


def test_the_github_token_and_the_secrets_stay_apart(rig: Rig) -> None:
    out = curl(rig, "https://api.github.com/user", f"x-api-key: {PLACEHOLDER}")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["authorization"] == [f"Bearer {TOKEN}"]
    assert header_values(rig.github, "x-api-key") == [PLACEHOLDER]


def test_the_inner_host_must_match_and_the_error_body_holds_no_value(rig: Rig) -> None:
    out = curl(rig, "https://api.anthropic.com/", "Host: other.test", extra=("-i",))
    assert "HTTP/1.1 421" in out.stdout and "host-mismatch" in out.stdout, out.stdout
    assert not any(s in out.stdout + out.stderr for s in SECRETS)


def test_a_secret_host_is_never_a_raw_tunnel(rig: Rig) -> None:
    # Trusting only the upstream's own CA fails: the proxy terminates TLS.
    out = curl(rig, "https://api.anthropic.com/", cafile="../upstream-ca.pem")
    assert out.returncode == 60, out


def test_a_failing_command_holds_and_sends_nothing(rig: Rig) -> None:
    assert wait_for(lambda: "secret for failing.test" in rig.proxy.log_text(), 10)
    before = len(rig.other.seen)
    out = curl(rig, "https://failing.test/", f"x-key: {PLACEHOLDER}")
    assert out.returncode == 0, out.stderr
    assert len(rig.other.seen) == before + 1
    assert header_values(rig.other, "x-key") == []  # the client's dropped, none set


def test_renewal_changes_the_value_without_a_restart(rig: Rig) -> None:
    rig.real_file.write_text("sk-ant-RENEWED-value-42\n")
    try:
        def renewed() -> bool:
            curl(rig, "https://api.anthropic.com/v1/renewal")
            return header_values(rig.anthropic, "x-api-key") == ["sk-ant-RENEWED-value-42"]

        assert wait_for(renewed, 15), "the value was not renewed"
        assert rig.proxy.proc.poll() is None
    finally:
        rig.real_file.write_text(REAL + "\n")

    def back() -> bool:
        curl(rig, "https://api.anthropic.com/v1/back")
        return header_values(rig.anthropic, "x-api-key") == [REAL]

    assert wait_for(back, 15)


def test_no_value_goes_to_another_host(rig: Rig) -> None:
    out = curl(rig, f"https://other.test:{rig.other.port}/", cafile="../upstream-ca.pem")
    assert out.returncode == 0, out.stderr
    for up in (rig.other, rig.github):
        for request in up.seen:
            text = json.dumps(request)
            assert not any(s in text for s in (REAL, BEARER, BASIC, FAILING)), text
            assert base64.b64encode(f"x-access-token:{BASIC}".encode()).decode() not in text


def test_the_ca_permits_the_secret_hosts(rig: Rig) -> None:
    cert = x509.load_pem_x509_certificate((rig.egress / "ca.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert names.critical
    assert [n.value for n in names.value.permitted_subtrees or []] == [
        "api.github.com", "api.anthropic.com", "api.openai.com", "git.example.test",
        "failing.test"]
    # gh's login in the egress dir names the token's hosts only.
    assert "anthropic" not in (rig.egress / "gh" / "hosts.yml").read_text()


def test_a_leaf_verifies_for_the_secret_host_only(tmp_path: Path) -> None:
    secrets = parse_secrets(json.dumps([{"host": "api.anthropic.com", "header": "x-api-key",
                                         "command": "true"}]), "t", ("api.github.com",))
    authority = make_authority(["api.github.com", *(s.host for s in secrets)])
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(authority.cert_pem())
    for host, ok in (("api.anthropic.com", True), ("anthropic.com", False),
                     ("evil.test", False)):
        cert, key = issue_leaf(authority, host)
        port, thread = serve_once(server_context(cert, key, authority.cert), b"ok")
        client = ssl.create_default_context(cafile=str(ca_file))
        with socket.create_connection(("127.0.0.1", port)) as raw:
            if ok:
                with client.wrap_socket(raw, server_hostname=host) as tls:
                    tls.sendall(b"hi")
                    assert tls.recv(10) == b"ok"
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree"):
                    client.wrap_socket(raw, server_hostname=host)
        thread.join(5)


def test_zz_no_value_in_logs_or_the_egress_dir(rig: Rig) -> None:
    # Runs last in the module: the proxy has served, renewed and failed by now.
    assert rig.proxy.stop() == 0
    err = rig.proxy.proc.stderr.read().decode() if rig.proxy.proc.stderr else ""
    log = rig.proxy.log_text()
    assert "secret for failing.test" in log and "status 3" in log
    texts = [err, log] + [p.read_bytes().decode("latin-1") for p in rig.egress.rglob("*")
                          if p.is_file()]
    for text in texts:
        assert not any(s in text for s in SECRETS), text[:2000]
        assert "RENEWED" not in text


BAD: list[tuple[object, str]] = [
    ("not json", "not valid JSON"),
    ({"host": "a.test"}, "must be a JSON list"),
    (["x"], "entry 0: must be a JSON object"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "colour": 1}], "unknown key 'colour'"),
    ([{"header": "x-k", "command": "true"}], "missing key 'host'"),
    ([{"host": "a.test", "command": "true"}], "missing key 'header'"),
    ([{"host": "a.test", "header": "x-k"}], "missing key 'command'"),
    ([{"host": "a.test", "header": "x-k", "command": "true"},
      {"host": "A.test.", "header": "x-j", "command": "true"}], "entry 1: duplicate host a.test"),
    ([{"host": "api.github.com", "header": "x-k", "command": "true"}],
     "duplicate host api.github.com (an --inject host)"),
    ([{"host": "a.test", "header": "Host", "command": "true"}], "'Host' is a field"),
    ([{"host": "a.test", "header": "content-length", "command": "true"}], "'content-length'"),
    ([{"host": "a.test", "header": "Transfer-Encoding", "command": "true"}], "Transfer-Encoding"),
    ([{"host": "a.test", "header": "Connection", "command": "true"}], "'Connection' is a field"),
    ([{"host": "a.test", "header": "Keep-Alive", "command": "true"}], "Keep-Alive"),
    ([{"host": "a.test", "header": "Upgrade", "command": "true"}], "Upgrade"),
    ([{"host": "a.test", "header": "TE", "command": "true"}], "'TE'"),
    ([{"host": "a.test", "header": "Proxy-Authorization", "command": "true"}], "Proxy-Auth"),
    ([{"host": "a.test", "header": "x key", "command": "true"}], "not a valid header name"),
    ([{"host": "a.test", "header": "x:k", "command": "true"}], "not a valid header name"),
    ([{"host": "a.test", "header": "x-k\r\nEvil: 1", "command": "true"}], "not a valid header"),
    ([{"host": "a.test", "header": "", "command": "true"}], "not a valid header name"),
    ([{"host": "a.test", "header": 7, "command": "true"}], "not a valid header name"),
    ([{"host": "10.0.0.1", "header": "x-k", "command": "true"}], "DNS name"),
    ([{"host": "bad host", "header": "x-k", "command": "true"}], "not a valid host"),
    ([{"host": "a.test", "header": "x-k", "command": ""}], "'command' is empty"),
    ([{"host": "a.test", "header": "x-k", "command": "echo 'open"}], "cannot be split"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "format": "Bearer"}], "exactly once"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "format": "{}{}"}], "exactly once"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "format": "a\r\n{}"}], "one line"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "every": 0}], "'every'"),
    ([{"host": "a.test", "header": "x-k", "command": "true", "every": "5"}], "'every'"),
]


@pytest.mark.parametrize(("content", "message"), BAD)
def test_a_bad_secrets_file_is_refused_at_start(tmp_path: Path, content: object,
                                                 message: str) -> None:
    path = tmp_path / "secrets.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    out = subprocess.run(["egress-proxy", "--listen", "127.0.0.1:0", "--inject",
                          "api.github.com", "--secrets", str(path)],
                         capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2, out
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"egress-proxy: --secrets {path}"), lines
    assert message in lines[0], lines


def test_a_missing_secrets_file_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(["egress-proxy", "--listen", "127.0.0.1:0", "--secrets",
                          str(tmp_path / "absent.json")],
                         capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2 and "No such file" in out.stderr, out
    assert "Traceback" not in out.stderr
