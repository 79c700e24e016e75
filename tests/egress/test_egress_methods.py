"""Every method gets its refusal, on every path: plain HTTP, CONNECT, SOCKS5, and inside an
inject host's tunnel (reached by CONNECT and by SOCKS5).

A HEAD refusal once sent nothing (h11 will not put a body after HEAD, and the
failure was swallowed): curl said "Empty reply from server".  Each case here
runs the real curl against a real egress-proxy and reads its log line and its
--record line.  No upstream is needed: every request is refused before one is
dialled.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator

import pytest
from egress_proxyproc import ProxyProc, start_proxy
from egress_world import require

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "X-CUSTOM"]
BLOCKED = "blocked.test"
INJECT = "inject.test"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    require("curl")
    tmp = tmp_path_factory.mktemp("methods")
    p = start_proxy(["--allow", "allowed.test", "--inject", INJECT, "--egress-dir",
                     str(tmp / "egress"), "--record", str(tmp / "record.jsonl")],
                    log=tmp / "log", socks=True)
    p.egress_dir = tmp / "egress"
    yield p
    assert p.stop() == 0


def _log_lines(proxy: ProxyProc, since: int) -> list[str]:
    return proxy.log_text().splitlines()[since:]


def _records(proxy: ProxyProc, since: int) -> list[dict[str, object]]:
    assert proxy.egress_dir is not None
    path = proxy.egress_dir.parent / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()[since:]]


def _counts(proxy: ProxyProc) -> tuple[int, int]:
    assert proxy.egress_dir is not None
    path = proxy.egress_dir.parent / "record.jsonl"
    records = path.read_text().splitlines() if path.exists() else []
    return len(proxy.log_text().splitlines()), len(records)


def _curl(method: str, *args: str) -> subprocess.CompletedProcess[str]:
    """curl with ``method`` (HEAD as -I: -X HEAD would wait for a body), headers on stdout."""
    how = ["-I"] if method == "HEAD" else ["-X", method]
    return subprocess.run(["curl", "-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null",
                           "-w", "connect=%{http_connect} code=%{http_code}\n", *how, *args],
                          capture_output=True, text=True, check=False, timeout=30)


def _head_of(out: str) -> tuple[str, dict[str, str]]:
    """The status line and fields of the last response head in curl's -D output."""
    heads = [h for h in out.split("\n\n") if h.startswith("HTTP/")]  # text mode: no \r
    lines = heads[-1].splitlines()
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return lines[0], {k.lower(): v for k, v in fields.items()}


@pytest.mark.parametrize("method", METHODS)
def test_plain_http_refusal(proxy: ProxyProc, method: str) -> None:
    log0, rec0 = _counts(proxy)
    out = _curl(method, "-x", proxy.http, f"http://{BLOCKED}/path?q=1")
    assert out.returncode == 0, out.stderr  # HEAD too: a whole response, not an empty reply
    status, fields = _head_of(out.stdout)
    assert status == "HTTP/1.1 403 Forbidden"
    assert fields["x-proxy-error"] == "blocked-by-allowlist"
    assert fields["connection"] == "close" and int(fields["content-length"]) > 0
    assert "code=403" in out.stdout
    [line] = _log_lines(proxy, log0)
    assert f" egress-proxy refused host={BLOCKED} port=80 pid=" in line
    assert line.endswith(f" method={method} reason=403 {BLOCKED}:80 is not on the allow list")
    [rec] = _records(proxy, rec0)
    assert (rec["verdict"], rec["host"], rec["port"], rec["method"]) == (
        "refused", BLOCKED, 80, method)


@pytest.mark.parametrize("method", METHODS)
def test_connect_refusal(proxy: ProxyProc, method: str) -> None:
    """The tunnel is refused before any request in it: 403 to the CONNECT, whatever follows."""
    log0, _ = _counts(proxy)
    out = _curl(method, "-x", proxy.http, f"https://{BLOCKED}/")
    assert out.returncode != 0 and "connect=403" in out.stdout, (out.stdout, out.stderr)
    status, fields = _head_of(out.stdout)
    assert status == "HTTP/1.1 403 Forbidden"
    assert fields["x-proxy-error"] == "blocked-by-allowlist"
    [line] = _log_lines(proxy, log0)
    assert line.endswith(f"method=CONNECT reason=403 {BLOCKED}:443 is not on the allow list")


@pytest.mark.parametrize("method", METHODS)
def test_socks5_refusal(proxy: ProxyProc, method: str) -> None:
    """SOCKS5 refuses the connect with reply 2 (not allowed by ruleset): no method is read."""
    log0, rec0 = _counts(proxy)
    out = _curl(method, "--socks5-hostname", str(proxy.socks), f"http://{BLOCKED}/")
    assert out.returncode != 0
    assert "(2)" in out.stderr or "not allowed" in out.stderr.lower(), out.stderr
    [line] = _log_lines(proxy, log0)
    assert line.endswith(f"reason=socks blocked-by-allowlist: {BLOCKED}:80 is not on the "
                         "allow list")
    assert " method=" not in line
    [rec] = _records(proxy, rec0)
    assert (rec["verdict"], rec["host"], rec["port"]) == ("refused", BLOCKED, 80)


@pytest.mark.parametrize("via", ["connect", "socks5"])
@pytest.mark.parametrize("method", METHODS)
def test_refusal_inside_an_inject_hosts_tunnel(proxy: ProxyProc, method: str, via: str) -> None:
    """Inside the TLS the proxy terminates: a request naming another Host gets 421, HEAD too."""
    assert proxy.egress_dir is not None
    log0, rec0 = _counts(proxy)
    route = (["-x", proxy.http] if via == "connect"
             else ["--socks5-hostname", str(proxy.socks)])
    out = _curl(method, *route, "--cacert", str(proxy.egress_dir / "ca.pem"),
                "-H", "Host: elsewhere.test", f"https://{INJECT}/")
    assert out.returncode == 0, out.stderr
    status, fields = _head_of(out.stdout)
    assert status.endswith(" 421 Misdirected Request"), out.stdout
    assert fields["x-proxy-error"] == "host-mismatch"
    [line] = _log_lines(proxy, log0)
    assert line.endswith(f"method={method} reason=421 the request's Host is not {INJECT}")
    [rec] = _records(proxy, rec0)
    assert (rec["verdict"], rec["method"]) == ("refused", method)


def test_head_refusal_on_the_wire(proxy: ProxyProc) -> None:
    """The exact bytes: a whole head, no body, then the proxy closes."""
    head, rest = _exchange(proxy, f"HEAD http://{BLOCKED}/ HTTP/1.1\r\nHost: {BLOCKED}\r\n"
                                  "\r\n".encode())
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n"), head
    assert b"\r\nX-Proxy-Error: blocked-by-allowlist" in head
    assert rest == b""


def _exchange(proxy: ProxyProc, data: bytes) -> tuple[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    return head, rest


@pytest.mark.parametrize(("method", "body"), [(b"HEAD", False), (b"GET", True)])
def test_a_bad_target_is_answered_by_the_method(proxy: ProxyProc, method: bytes,
                                                body: bool) -> None:
    """Not only allow-list refusals: a 400 for a HEAD has its head and no body."""
    head, rest = _exchange(proxy, method + b" /relative HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), head
    assert rest.startswith(b"egress-proxy: a proxy request needs") if body else rest == b""


def test_no_method_read_yet_gets_a_body(proxy: ProxyProc) -> None:
    head, rest = _exchange(proxy, b"GARBAGE\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert rest.startswith(b"egress-proxy: ")
