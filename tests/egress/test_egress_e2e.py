"""egress-proxy end to end: real curl and git through the real proxy, real TLS.

Stand-in github.com (git http-backend) and api.github.com (an echo) run on
127.0.0.1 with their own CA; the proxy reaches them through --resolve and
--upstream-ca, and clients trust the proxy's bundle.pem.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from egress_proxyproc import ProxyProc
from egress_world import TOKEN, World, require


def curl(proxy: ProxyProc, *args: str, ca: Path | None = None) -> subprocess.CompletedProcess[str]:
    require("curl")
    argv = ["curl", "-sS", "--max-time", "20", "--proxy", proxy.http]
    argv += ["--cacert", str(ca or (proxy.egress_dir / "bundle.pem"))]  # type: ignore[operator]
    return subprocess.run([*argv, *args], capture_output=True, text=True, check=False)


def git_env(proxy: ProxyProc, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "HTTPS_PROXY": proxy.http,
        "GIT_SSL_CAINFO": str(proxy.egress_dir / "bundle.pem"),  # type: ignore[operator]
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
        "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com",
    }


def test_git_clone_and_push_get_the_token(proxy: ProxyProc, world: World, tmp_path: Path) -> None:
    require("git")
    before = len(world.git.seen)
    env = git_env(proxy, tmp_path)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "https://github.com/repo.git", str(clone)],
                   env=env, check=True, timeout=60)
    assert (clone / "README").read_text() == "hello\n"
    # Enough data that git streams the pack (chunked) rather than buffering it.
    (clone / "blob.bin").write_bytes(os.urandom(3 << 20))
    subprocess.run(["git", "-C", str(clone), "add", "blob.bin"], env=env, check=True)
    subprocess.run(["git", "-C", str(clone), "commit", "-qm", "big"], env=env, check=True)
    subprocess.run(["git", "-C", str(clone), "-c", "http.postBuffer=65536", "push", "-q",
                    "origin", "main"], env=env, check=True, timeout=60)
    head = subprocess.run(["git", "--git-dir", str(world.repo), "log", "-1", "--format=%s"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert head == "big"
    want = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    auths = [v for r in world.git.seen[before:] for k, v in r["headers"]
             if k.lower() == "authorization"]
    assert auths and set(auths) == {want}


def test_api_gets_bearer_and_client_authorization_is_replaced(proxy: ProxyProc) -> None:
    out = curl(proxy, "-H", "Authorization: token sandbox-forged", "-H",
               "Proxy-Authorization: Basic Zm9vOmJhcg==", "https://api.github.com/user")
    assert out.returncode == 0, out.stderr
    echoed = json.loads(out.stdout)
    assert echoed["authorization"] == [f"Bearer {TOKEN}"]
    assert echoed["host"] == "api.github.com"


def test_api_post_body_streams_through(proxy: ProxyProc, tmp_path: Path) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"z" * (2 << 20))
    out = curl(proxy, "-H", "Transfer-Encoding: chunked", "--data-binary", f"@{body}",
               "https://api.github.com/upload")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["body_length"] == 2 << 20


def test_inner_host_mismatch_is_refused(proxy: ProxyProc, world: World) -> None:
    out = curl(proxy, "-H", "Host: evil.test", "-i", "https://api.github.com/user")
    assert "HTTP/1.1 421 Misdirected Request" in out.stdout
    assert "X-Proxy-Error: host-mismatch" in out.stdout
    assert TOKEN not in out.stdout
    assert "evil.test" not in json.dumps(world.api.seen)


def test_allowed_host_is_a_raw_tunnel(proxy: ProxyProc, world: World) -> None:
    # Trusting only the stand-ins' CA works: the client sees the upstream's own
    # certificate, so the proxy did not terminate TLS.
    out = curl(proxy, f"https://allowed.test:{world.plain.port}/x", ca=world.ca_file)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["authorization"] == []


def test_inject_host_is_never_a_raw_tunnel(proxy: ProxyProc, world: World) -> None:
    # Trusting only the upstream's CA fails: the proxy always presents its own leaf.
    out = curl(proxy, "https://github.com/repo.git/info/refs", ca=world.ca_file)
    assert out.returncode == 60, out.stderr
    cert = _leaf_through_connect(proxy, "github.com")
    assert cert["issuer"] == ((("commonName", "agent-sandbox egress proxy CA"),),)


def _leaf_through_connect(proxy: ProxyProc, host: str) -> dict[str, object]:
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(proxy.egress_dir / "ca.pem"))  # type: ignore[operator]
        with ctx.wrap_socket(s, server_hostname=host) as tls:
            return tls.getpeercert()  # type: ignore[return-value]


def test_denied_host_gets_403_with_x_proxy_error(proxy: ProxyProc) -> None:
    out = curl(proxy, "-i", "http://denied.test/")
    assert out.stdout.startswith("HTTP/1.1 403")
    assert "X-Proxy-Error: blocked-by-allowlist" in out.stdout
    assert "denied.test" in out.stdout.split("\n\n", 1)[1]
    connect = curl(proxy, "-v", "https://denied.test/")
    assert connect.returncode != 0
    assert "X-Proxy-Error: blocked-by-allowlist" in connect.stderr
    assert "host=denied.test port=443" in proxy.log_text()


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "10.1.2.3",
                                  "[::1]", "[::ffff:127.0.0.1]", "169.254.169.254"])
def test_numeric_non_public_hosts_are_not_allowed(proxy: ProxyProc, host: str) -> None:
    out = curl(proxy, "-i", "--path-as-is", f"http://{host}/")
    assert out.stdout.startswith("HTTP/1.1 403"), out


def test_plain_http_to_inject_host_is_refused(proxy: ProxyProc) -> None:
    out = curl(proxy, "-i", "http://github.com/")
    assert out.stdout.startswith("HTTP/1.1 403")
    assert "plain HTTP" in out.stdout


def test_socks5_hostname_works_and_is_filtered(proxy: ProxyProc, world: World) -> None:
    base = ["curl", "-sS", "--max-time", "20", "--socks5-hostname", str(proxy.socks)]
    ok = subprocess.run([*base, "--cacert", str(world.ca_file),
                         f"https://allowed.test:{world.plain.port}/s"],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    injected = subprocess.run([*base, "--cacert", str(proxy.egress_dir / "bundle.pem"),  # type: ignore[operator]
                               "https://api.github.com/socks"],
                              capture_output=True, text=True, check=False)
    assert json.loads(injected.stdout)["authorization"] == [f"Bearer {TOKEN}"]
    denied = subprocess.run([*base, "https://denied.test/"], capture_output=True, text=True,
                            check=False)
    assert denied.returncode == 97
    numeric = subprocess.run([*base, "http://0x7f.1/"], capture_output=True, text=True,
                             check=False)
    assert numeric.returncode == 97
    assert "socks blocked-by-allowlist" in proxy.log_text()


def test_egress_dir_holds_nothing_secret(proxy: ProxyProc) -> None:
    d = proxy.egress_dir
    assert d is not None
    names = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    assert names == ["bundle.pem", "ca.pem", "gh", "gh/config.yml", "gh/hosts.yml"]
    for path in d.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data
            assert b"PRIVATE KEY" not in data
            assert path.stat().st_mode & 0o444 == 0o444
    assert (d / "bundle.pem").read_bytes().endswith((d / "ca.pem").read_bytes())


def test_token_reaches_inject_hosts_only(proxy: ProxyProc, world: World) -> None:
    # Run after the others in this module: everything the proxy wrote so far.
    curl(proxy, f"https://allowed.test:{world.plain.port}/after", ca=world.ca_file)
    assert TOKEN not in json.dumps(world.plain.seen)
    assert TOKEN not in proxy.log_text()
    b64 = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert b64 not in proxy.log_text()


def _inside(proxy: ProxyProc, host: str, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(proxy.egress_dir / "ca.pem"))  # type: ignore[operator]
        with ctx.wrap_socket(s, server_hostname=host) as tls:
            tls.sendall(request)
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
            return data


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET https://api.github.com/abs HTTP/1.1\r\nHost: api.github.com\r\n"
         b"Connection: close\r\n\r\n", b"200"),
        (b"GET https://evil.test/abs HTTP/1.1\r\nHost: api.github.com\r\n\r\n", b"421"),
        (b"GET http://api.github.com/abs HTTP/1.1\r\nHost: api.github.com\r\n\r\n", b"421"),
        (b"GET /x HTTP/1.1\r\nHost: api.github.com\r\nHost: evil.test\r\n\r\n", b"400"),
        (b"GET /x HTTP/1.1\r\nHost: api.github.com:8443\r\n\r\n", b"421"),
        (b"GET /x HTTP/1.0\r\n\r\n", b"421"),
        (b"CONNECT evil.test:443 HTTP/1.1\r\nHost: api.github.com\r\n\r\n", b"405"),
    ],
)
def test_requests_inside_the_tunnel_are_held_to_its_host(proxy: ProxyProc, world: World,
                                                         request_bytes: bytes,
                                                         status: bytes) -> None:
    data = _inside(proxy, "api.github.com", request_bytes)
    assert data.split(b" ", 2)[1] == status, data
    if status == b"200":
        assert json.loads(data.split(b"\r\n\r\n", 1)[1])["authorization"] == [f"Bearer {TOKEN}"]
    else:
        assert TOKEN.encode() not in data
