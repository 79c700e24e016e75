"""The proxy attacks, run inside a network namespace of their own.

    unshare -n -m python3 attacks_ns.py OUT.json TMPDIR

The namespace has only a loopback interface, so no attack (and no bug) can
send a packet off the machine; on it live the addresses an SSRF goes for
(169.254.169.254, 10.0.0.1, 192.168.1.1, 172.16.0.1, 100.64.0.1, fd00::1),
each with a canary listening on ports 80, 443 and 6443 that counts every
connection that reaches it.  A private /etc/hosts (bind-mounted in this
mount namespace only; the real file is untouched) pins names to those
addresses without any ``--resolve`` trust.  Each case writes a row:
[area, case, expected, observed, passed].
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stress import world
from stress.common import HERE

ADDRESSES_V4 = ["169.254.169.254", "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1"]
ADDRESSES_V6 = ["fd00::1"]
CANARY_PORTS = (80, 443, 6443)
HOSTS = """127.0.0.1 localhost
::1 six.stress.test
127.0.0.1 evil.stress.test
169.254.169.254 metadata.stress.test
10.0.0.1 private.stress.test
::ffff:127.0.0.1 mapped.stress.test
"""
Row = list[object]
ROWS: list[Row] = []
HITS: list[str] = []
REFUSALS = (400, 403, 405, 421, 431, 501)


def setup_namespace(tmp: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in ADDRESSES_V4:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    for address in ADDRESSES_V6:
        subprocess.run(["ip", "-6", "addr", "add", f"{address}/128", "dev", "lo"], check=True)
    hosts = tmp / "hosts"
    hosts.write_text(HOSTS)
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def canaries() -> None:
    """Dual-stack listeners on every address: each accept is an SSRF that got through."""
    for port in CANARY_PORTS:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen(64)

        def accept(s: socket.socket = sock) -> None:
            while True:
                conn, _ = s.accept()
                HITS.append(f"{conn.getsockname()[0]}:{conn.getsockname()[1]}")
                conn.close()

        threading.Thread(target=accept, daemon=True).start()


def row(area: str, case: str, expected: str, observed: str, passed: bool) -> None:
    ROWS.append([area, case, expected, observed, passed])


# --- SSRF ------------------------------------------------------------------------------


async def connect_status(port: int, target: str) -> tuple[int, str]:
    _, writer, head = await world.connect(port, target)
    world.close(writer)
    return world.status_of(head), world.header(head, "x-proxy-error") or ""


async def socks_reply(port: int, atyp: int, address: bytes, dport: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"\x05\x01\x00")
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(2), 5)
        writer.write(bytes([5, 1, 0, atyp]) + address + struct.pack("!H", dport))
        await writer.drain()
        reply = await asyncio.wait_for(reader.readexactly(2), 5)
        return reply[1]
    except (asyncio.IncompleteReadError, ConnectionError):
        return -1
    finally:
        world.close(writer)


async def plain_status(port: int, url: str, host: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head, _ = await world.request(reader, writer,
                                      f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        return world.status_of(head), world.header(head, "x-proxy-error") or ""
    except (asyncio.IncompleteReadError, ConnectionError):
        return -1, ""
    finally:
        world.close(writer)


SSRF_CONNECT = [
    ("loopback literal", "127.0.0.1:443"),
    ("loopback decimal", "2130706433:443"),
    ("loopback hex", "0x7f000001:443"),
    ("loopback octal", "0177.0.0.1:443"),
    ("loopback short 127.1", "127.1:443"),
    ("loopback mixed 0x7f.1", "0x7f.1:443"),
    ("IPv6 loopback", "[::1]:443"),
    ("IPv4-mapped loopback", "[::ffff:127.0.0.1]:443"),
    ("IPv4-mapped, hex words", "[::ffff:7f00:1]:443"),
    ("IPv4-mapped, long form", "[0:0:0:0:0:ffff:7f00:1]:443"),
    ("IPv4-compatible loopback", "[::127.0.0.1]:443"),
    ("NAT64 loopback", "[64:ff9b::7f00:1]:443"),
    ("unspecified 0.0.0.0", "0.0.0.0:443"),
    ("unspecified 0", "0:443"),
    ("IPv6 unspecified", "[::]:443"),
    ("metadata literal", "169.254.169.254:80"),
    ("metadata hex", "0xa9fea9fe:80"),
    ("metadata decimal", "2852039166:80"),
    ("metadata IPv4-mapped", "[::ffff:169.254.169.254]:80"),
    ("RFC 1918 10/8", "10.0.0.1:443"),
    ("RFC 1918 10/8 octal", "012.0.0.1:443"),
    ("RFC 1918 192.168/16", "192.168.1.1:443"),
    ("RFC 1918 172.16/12", "172.16.0.1:443"),
    ("CGNAT 100.64/10", "100.64.0.1:443"),
    ("IPv6 unique local", "[fd00::1]:443"),
    ("IPv6 link-local with zone", "[fe80::1%25lo]:443"),
    ("DNS: localhost", "localhost:443"),
    ("DNS: LOCALHOST. (case, root dot)", "LOCALHOST.:443"),
    ("DNS: name pinned to 127.0.0.1 in /etc/hosts, no --resolve", "evil.stress.test:443"),
    ("DNS: name for 169.254.169.254", "metadata.stress.test:80"),
    ("DNS: name for ::1", "six.stress.test:443"),
    ("DNS: name for ::ffff:127.0.0.1", "mapped.stress.test:443"),
    ("DNS: name for 10.0.0.1", "private.stress.test:443"),
    ("loopback on another port (6443)", "127.0.0.1:6443"),
]
# Every target above is on the allow list, so the address rules alone must refuse it.
ALLOW = ("other.stress.test,plain.stress.test,127.0.0.1,127.0.0.1:6443,[::1],[::ffff:127.0.0.1],"
         "[::127.0.0.1],[64:ff9b::7f00:1],0.0.0.0,[::],169.254.169.254,[::ffff:169.254.169.254],"
         "10.0.0.1,192.168.1.1,172.16.0.1,100.64.0.1,[fd00::1],localhost,evil.stress.test,"
         "metadata.stress.test,six.stress.test,mapped.stress.test,private.stress.test")


async def ssrf(proxy: world.Proxy) -> None:
    for name, target in SSRF_CONNECT:
        before = len(HITS)
        try:
            status, kind = await connect_status(proxy.port, target)
        except (OSError, TimeoutError) as exc:
            status, kind = -1, f"{type(exc).__name__}"
        hits = len(HITS) - before
        row("SSRF (CONNECT)", f"{name}: CONNECT {target}", "refused (403 blocked-address, or 400)",
            f"{status} {kind}; canary connections: {hits}", status in REFUSALS and hits == 0)
    socks_cases = [
        ("SOCKS5 IPv4 127.0.0.1", 1, socket.inet_aton("127.0.0.1"), 443),
        ("SOCKS5 IPv4 169.254.169.254", 1, socket.inet_aton("169.254.169.254"), 80),
        ("SOCKS5 IPv6 ::1", 4, socket.inet_pton(socket.AF_INET6, "::1"), 443),
        ("SOCKS5 IPv6 ::ffff:127.0.0.1", 4, socket.inet_pton(socket.AF_INET6,
                                                           "::ffff:127.0.0.1"), 443),
        ("SOCKS5 name 2130706433", 3, b"\x0a2130706433", 443),
        ("SOCKS5 name localhost", 3, b"\x09localhost", 443),
        ("SOCKS5 name evil.stress.test (hosts: 127.0.0.1)", 3, b"\x10evil.stress.test", 443),
        ("SOCKS5 name with NUL: other.stress.test\\0", 3, b"\x12other.stress.test\x00", 443),
    ]
    assert proxy.socks is not None
    for name, atyp, address, dport in socks_cases:
        before = len(HITS)
        try:
            code = await socks_reply(proxy.socks, atyp, address, dport)
        except (OSError, TimeoutError) as exc:
            code = -2
            name += f" ({type(exc).__name__})"
        hits = len(HITS) - before
        row("SSRF (SOCKS5)", name, "refused (reply != 0)", f"reply {code}; canary connections: "
            f"{hits}", code != 0 and hits == 0)
    plain_cases = [
        ("plain HTTP to 127.0.0.1", "http://127.0.0.1/", "127.0.0.1"),
        ("plain HTTP to 0x7f.1", "http://0x7f.1/", "0x7f.1"),
        ("plain HTTP to the metadata address", "http://169.254.169.254/latest/meta-data/",
         "169.254.169.254"),
        ("plain HTTP to evil.stress.test (hosts: 127.0.0.1)", "http://evil.stress.test/",
         "evil.stress.test"),
        ("plain HTTP, userinfo: http://other.stress.test@127.0.0.1/",
         "http://other.stress.test@127.0.0.1/", "other.stress.test"),
        ("plain HTTP, backslash: http://127.0.0.1\\@other.stress.test/",
         "http://127.0.0.1\\@other.stress.test/", "other.stress.test"),
    ]
    for name, url, host in plain_cases:
        before = len(HITS)
        try:
            status, kind = await plain_status(proxy.port, url, host)
        except (OSError, TimeoutError) as exc:
            status, kind = -2, type(exc).__name__
        hits = len(HITS) - before
        row("SSRF (plain HTTP)", name, "refused (403/400)", f"{status} {kind}; canary "
            f"connections: {hits}", status in REFUSALS and hits == 0)
    status, kind = await connect_status(proxy.port, "unlisted.stress.test:443")
    row("allow list", "CONNECT a host not on the allow list", "403 blocked-by-allowlist",
        f"{status} {kind}", status == 403 and kind == "blocked-by-allowlist")
    status, kind = await connect_status(proxy.port, "sub.other.stress.test:443")
    row("allow list", "CONNECT a subdomain of an exact pattern", "403 blocked-by-allowlist",
        f"{status} {kind}", status == 403)
    status, kind = await connect_status(proxy.port, "other.stress.test:22")
    row("allow list", "CONNECT an allowed host on another port (22)", "403",
        f"{status} {kind}", status == 403)


async def controls(proxy: world.Proxy) -> None:
    """The instruments work: a connection that reaches a canary is counted."""
    before = len(HITS)
    with socket.create_connection(("169.254.169.254", 80), timeout=5):
        pass
    await asyncio.sleep(0.1)
    row("control", "direct connection to 169.254.169.254:80 (no proxy)", "counted by the canary",
        f"canary connections: {len(HITS) - before}", len(HITS) - before == 1)
    before = len(HITS)
    status, kind = await connect_status(proxy.port, "pinned.stress.test:443")
    await asyncio.sleep(0.1)
    row("control", "CONNECT a name pinned with --resolve to 127.0.0.1:443 (trusted by design)",
        "200 and counted by the canary", f"{status} {kind}; canary connections: "
        f"{len(HITS) - before}", status == 200 and len(HITS) - before == 1)
    HITS.clear()


# --- token exfiltration and Host games --------------------------------------------------


async def tunnel_request(proxy: world.Proxy, connect_to: str, sni: str, raw: bytes,
                         verify: bool = True, socks: bool = False) -> tuple[int, str, bytes]:
    """Send ``raw`` inside a TLS tunnel to ``connect_to``; (status, proxy error, body)."""
    ctx = proxy.client_context()
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if socks:
        assert proxy.socks is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.socks)
        host, _, port = connect_to.rpartition(":")
        writer.write(b"\x05\x01\x00" + bytes([5, 1, 0, 3, len(host)]) + host.encode()
                     + struct.pack("!H", int(port)))
        await writer.drain()
        await reader.readexactly(2 + 10)
    else:
        reader, writer, head = await world.connect(proxy.port, connect_to)
        if world.status_of(head) != 200:
            world.close(writer)
            return world.status_of(head), world.header(head, "x-proxy-error") or "", b""
    try:
        await world.start_tls(reader, writer, ctx, sni)
        head, body = await world.request(reader, writer, raw)
        return world.status_of(head), world.header(head, "x-proxy-error") or "", body
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError) as exc:
        return -1, type(exc).__name__, b""
    finally:
        world.close(writer)


def _token_forms(token: str) -> list[str]:
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return [token, basic]


async def exfiltration(proxy: world.Proxy, up: world.Upstreams, token: str) -> None:
    def token_reached_other(since: int) -> list[str]:
        bad = []
        for rec in up.records()[since:]:
            auths = rec.get("authorization")
            auth = " ".join(map(str, auths)) if isinstance(auths, list) else ""
            named = rec.get("host")
            hosts = [str(h).lower() for h in named] if isinstance(named, list) else []
            if any(f in auth for f in _token_forms(token)) and (
                    rec.get("server") != "tls" or len(hosts) != 1
                    or hosts[0].split(":")[0] not in ("github.com", "api.github.com")):
                bad.append(f"{rec.get('server')} Host={hosts} path={rec.get('path')}")
        return bad

    cases = [
        ("Host header swapped inside the github.com tunnel", "github.com:443", "github.com",
         world.get("other.stress.test"), True, False),
        ("absolute-form https://other.stress.test/ inside the github.com tunnel",
         "github.com:443", "github.com",
         b"GET https://other.stress.test/small HTTP/1.1\r\nHost: github.com\r\n\r\n", True, False),
        ("two Host headers (github.com, other)", "github.com:443", "github.com",
         b"GET /small HTTP/1.1\r\nHost: github.com\r\nHost: other.stress.test\r\n\r\n", True,
         False),
        ("Host github.com:8443 (port swap)", "github.com:443", "github.com",
         world.get("github.com:8443"), True, False),
        ("Host github.com.other.stress.test (suffix)", "github.com:443", "github.com",
         world.get("github.com.other.stress.test"), True, False),
        ("Host with userinfo x@other.stress.test", "github.com:443", "github.com",
         world.get("github.com@other.stress.test"), True, False),
        ("SNI other.stress.test + Host other inside CONNECT github.com (no verify)",
         "github.com:443", "other.stress.test", world.get("other.stress.test"), False, False),
        ("CONNECT inside the intercepted tunnel", "api.github.com:443", "api.github.com",
         b"CONNECT other.stress.test:443 HTTP/1.1\r\nHost: other.stress.test:443\r\n\r\n", True,
         False),
        ("SOCKS5 to github.com, Host other inside", "github.com:443", "github.com",
         world.get("other.stress.test"), True, True),
        ("smuggling inside the tunnel: CL + TE", "api.github.com:443", "api.github.com",
         b"POST /small HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: 4\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", True, False),
    ]
    for name, connect_to, sni, raw, verify, socks in cases:
        since = len(up.records())
        try:
            status, kind, body = await tunnel_request(proxy, connect_to, sni, raw, verify, socks)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            status, kind, body = -2, type(exc).__name__, b""
        await asyncio.sleep(0.05)
        reached = token_reached_other(since)
        leaked = any(f.encode() in body for f in _token_forms(token))
        upstream_saw = len(up.records()) - since
        row("token exfiltration", name, "refused (421/405/400), token nowhere but GitHub",
            f"{status} {kind}; upstream requests: {upstream_saw}; token elsewhere: "
            f"{reached or 'none'}", status in REFUSALS and not reached and not leaked)

    # A redirect from "GitHub" to another host, followed by a client.
    since = len(up.records())
    status, _, _ = await tunnel_request(proxy, "github.com:443", "github.com",
                                        world.get("github.com", "/redirect"))
    up_ctx = ssl.create_default_context(cafile=str(up.ca_file))
    reader, writer, _ = await world.connect(proxy.port, "other.stress.test:443")
    await world.start_tls(reader, writer, up_ctx, "other.stress.test")
    await world.request(reader, writer, world.get("other.stress.test", "/landing"))
    world.close(writer)
    reached = token_reached_other(since)
    row("token exfiltration", "redirect from github.com to another host, followed",
        "the token only ever goes to github.com", f"302 then {len(up.records()) - since} "
        f"upstream requests; token at the other host: {reached or 'none'}", not reached)

    # Plain HTTP to a non-inject host with the sandbox's own credentials.
    since = len(up.records())
    status, _ = await plain_status(proxy.port, "http://plain.stress.test/small",
                                   "plain.stress.test")
    reached = token_reached_other(since)
    row("token exfiltration", "absolute-form plain HTTP to a non-inject host",
        "forwarded without the token", f"{status}; token at the host: {reached or 'none'}",
        not reached)
    status, kind = await plain_status(proxy.port, "http://github.com/", "github.com")
    row("token exfiltration", "plain HTTP to github.com", "403 (https only)", f"{status} {kind}",
        status == 403)
    status, kind = await connect_status(proxy.port, "github.com:80")
    row("token exfiltration", "CONNECT github.com:80", "403", f"{status} {kind}", status == 403)
    status, kind = await connect_status(proxy.port, "github.com:22")
    row("token exfiltration", "CONNECT github.com:22 (ssh)", "403", f"{status} {kind}",
        status == 403)

    # The sandbox's own Authorization and Proxy-Authorization are replaced.
    status, _, body = await tunnel_request(
        proxy, "api.github.com:443", "api.github.com",
        world.get("api.github.com", extra="Authorization: Bearer sandbox-forged\r\n"
                  "Proxy-Authorization: Basic c2FuZGJveA==\r\n"))
    want = world.expected_tag("api.github.com", token)
    ok = f"auth={want} n=1".encode() in body
    row("token exfiltration", "forged Authorization + Proxy-Authorization to api.github.com",
        "replaced: exactly one Authorization, the proxy's", f"{status} {body.decode().strip()}",
        ok)
    # Verification of the client certificate chain: the proxy's leaf only for inject hosts.
    try:
        status, kind, _ = await tunnel_request(proxy, "other.stress.test:443", "other.stress.test",
                                               world.get("other.stress.test"))
        minted = status == 200 and kind == ""
    except (OSError, ssl.SSLError):
        minted = False
    row("token exfiltration", "proxy CA trusted for a non-inject host (raw tunnel to other)",
        "TLS with the proxy CA fails (no leaf minted, name constraints)",
        "handshake failed as expected" if not minted else "a proxy leaf was accepted", not minted)


# --- smuggling and limits ---------------------------------------------------------------


async def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await world.read_head(reader, timeout)
        return world.status_of(head), world.header(head, "x-proxy-error") or ""
    except (asyncio.IncompleteReadError, ConnectionError):
        return -1, "closed"
    except TimeoutError:
        return -3, "no answer"
    finally:
        world.close(writer)


async def smuggling(proxy: world.Proxy, up: world.Upstreams) -> None:
    base = b"POST http://plain.stress.test/small HTTP/1.1\r\nHost: plain.stress.test\r\n"
    cases = [
        ("CL + TE", base + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         (400,)),
        ("two Content-Length", base + b"Content-Length: 3\r\nContent-Length: 30\r\n\r\nabc",
         (400,)),
        ("Content-Length list 3, 3", base + b"Content-Length: 3, 3\r\n\r\nabc", (400,)),
        ("obsolete line folding", base + b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", (400,)),
        ("bare LF", base.replace(b"\r\n", b"\n") + b"Content-Length: 0\n\n", (400,)),
        ("Transfer-Encoding: xchunked", base + b"Transfer-Encoding: xchunked\r\n\r\n",
         (400, 501)),
        ("space before colon", base + b"Content-Length : 3\r\n\r\nabc", (400,)),
        ("NUL in a header", base + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n", (400,)),
        ("oversized head (40 KiB of headers)", base + b"X-Pad: " + b"a" * 40000 + b"\r\n\r\n",
         (431,)),
        ("request line of 9 KiB", b"GET http://plain.stress.test/" + b"a" * 9216 +
         b" HTTP/1.1\r\nHost: plain.stress.test\r\n\r\n", (431, 414)),
        ("7,000 small headers (over 32 KiB)", base + b"X: y\r\n" * 7000 + b"\r\n", (431,)),
    ]
    for name, data, want in cases:
        since = len(up.records())
        status, kind = await raw_exchange(proxy.port, data)
        await asyncio.sleep(0.05)
        forwarded = len(up.records()) - since
        row("smuggling / limits", name, f"{'/'.join(map(str, want))}, nothing forwarded",
            f"{status} {kind}; forwarded upstream: {forwarded}", status in want and
            forwarded == 0)


async def slowloris(proxy: world.Proxy, idle: float, socks: bool) -> None:
    """One byte every idle/2 seconds: the head never completes; when is it cut off?"""
    port = proxy.socks if socks else proxy.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = (b"\x05\x02\x00\x01" + b"\x05\x01\x00\x03" + b"a" * 200 if socks else
            b"CONNECT other.stress.test:443 HTTP/1.1\r\nX-Slow: " + b"a" * 200)
    started = time.monotonic()
    limit = idle * 4
    closed_at = None
    for i in range(len(data)):
        if time.monotonic() - started > limit:
            break
        try:
            writer.write(data[i:i + 1])
            await writer.drain()
            got = await asyncio.wait_for(reader.read(4096), idle / 2)
            if socks and i == 3 and got:
                continue  # the method reply: the handshake goes on
            if got == b"" or got:
                closed_at = time.monotonic() - started
                break
        except TimeoutError:
            continue
        except ConnectionError:
            closed_at = time.monotonic() - started
            break
    world.close(writer)
    what = "SOCKS5 handshake" if socks else "HTTP request head"
    observed = (f"cut off after {closed_at:.1f} s" if closed_at is not None else
                f"still open after {limit:.0f} s of one byte per {idle / 2:.0f} s")
    row("slowloris", f"{what}, one byte every {idle / 2:.0f} s (--idle-timeout={idle:.0f})",
        f"closed within ~{idle:.0f} s of an incomplete head (408)", observed,
        closed_at is not None and closed_at <= idle * 2)


# --- another uid ----------------------------------------------------------------------------


def other_uid(proxy: world.Proxy) -> None:
    for label, args in (("HTTP CONNECT", ["-x", f"http://127.0.0.1:{proxy.port}"]),
                        ("SOCKS5", ["--socks5-hostname", f"127.0.0.1:{proxy.socks}"])):
        before = len(HITS)
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "curl", "-sS", "-k", "-m", "10", "-o", "/dev/null", "-w",
                               "%{http_code} %{http_connect}", *args,
                               "https://other.stress.test/small"],
                              capture_output=True, text=True, check=False)
        got = proc.stdout.strip()
        refused = proc.returncode != 0
        row("another uid", f"curl as nobody through the proxy ({label})",
            "refused (connection closed, nothing dialled)",
            f"curl exit {proc.returncode} ({got}; {proc.stderr.strip()[:80]}); canary "
            f"connections: {len(HITS) - before}", refused)


# --- the whole run --------------------------------------------------------------------------


async def main_async(tmp: Path, out: Path) -> None:
    up = world.start_upstreams(tmp)
    token = "stress-attack-token-" + os.urandom(8).hex()
    state = world.token_file(tmp, token)
    idle = 4.0
    proxy = world.start_world_proxy(
        tmp, up, f"--resolve=plain.stress.test:127.0.0.1:{up.ports['plain']}",
        f"--idle-timeout={idle:.0f}", "--resolve=pinned.stress.test:127.0.0.1:443",
        allow=ALLOW + ",pinned.stress.test",
        token_command=f"python3 {HERE / 'token_cmd.py'} {state}", socks=True)
    try:
        await controls(proxy)
        await ssrf(proxy)
        await exfiltration(proxy, up, token)
        await smuggling(proxy, up)
        await asyncio.gather(slowloris(proxy, idle, False), slowloris(proxy, idle, True))
        other_uid(proxy)
        # Nothing secret anywhere the sandbox or a log can see.
        places = [proxy.log, proxy.server.stderr_path,
                  *[p for p in proxy.egress.rglob("*") if p.is_file()]]
        found = [str(p) for p in places if token in p.read_text(errors="replace")]
        for name in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                if token.encode() in Path(f"/proc/{proxy.pid}/{name}").read_bytes():
                    found.append(f"/proc/PID/{name}")
        row("token exfiltration", "token in the log, stderr, egress dir, argv or environment",
            "nowhere", ", ".join(found) or "nowhere", not found)
        alive = proxy.server.proc.poll() is None
        text = proxy.log_text() + proxy.server.stderr_text()
        row("proxy health", "after every attack: alive, no internal error in the log",
            "alive, no internal error", f"alive={alive}; internal errors: "
            f"{text.count('internal error')}", alive and "internal error" not in text)
        row("SSRF (all)", "canary connections over the whole run", "0",
            f"{len(HITS)} {HITS[:3]}", not HITS)
    finally:
        proxy.server.stop()
        up.stop()
        out.write_text(json.dumps(ROWS))


def main() -> None:
    out, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    setup_namespace(tmp)
    canaries()
    asyncio.run(main_async(tmp, out))


if __name__ == "__main__":
    main()
