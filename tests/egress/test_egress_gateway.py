"""egress-proxy --control: one proxy, many tenants, each with its own credential and policy.

A real egress-proxy subprocess, 50 tenants added over its control socket, real
curl through HTTP CONNECT, plain HTTP and SOCKS5, and stand-ins on loopback
that record what reached them (docs/gateway.md).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trustme
from egress_proxyproc import start_proxy
from egress_upstreams import start
from egress_world import require
from gateway_rig import (
    Gateway,
    TenantKeys,
    codes,
    curl,
    echo_once,
    open_tunnel,
    start_echo,
)

TENANTS = 50


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    require("curl")
    tmp = tmp_path_factory.mktemp("gateway")
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert(*(f"sec{i}.test" for i in range(TENANTS + 40)))
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    tls = start("echo", str(cert_file), str(key_file))
    plain = start("echo", None, None)
    echo, echo_port = start_echo()
    control = str(tmp / "control.sock")
    proxy = start_proxy(["--control", control, "--upstream-ca", str(ca_file)],
                        log=tmp / "proxy.log", socks=True)
    gateway = Gateway(tmp, proxy, control, tls, plain, echo_port)
    for i in range(TENANTS):
        gateway.add(f"t{i}", i)
    yield gateway
    assert proxy.stop() == 0
    assert not os.path.exists(control)
    for up in (tls, plain):
        up.stop()
    echo.close()


def _tenant_traffic(gw: Gateway, i: int) -> dict[str, tuple[str, str]]:
    me = gw.tenants[f"t{i}"]
    user = f"{me.name}:{me.password}"
    nxt = (i + 1) % TENANTS
    return {
        "secret": codes(curl(gw, f"https://sec{i}.test/t{i}", "--cacert", str(me.ca),
                             user=user)),
        "allowed-socks": codes(curl(gw, f"http://ok{i}.test:{gw.plain.port}/t{i}",
                                    user=user, socks=True)),
        "other-allow": codes(curl(gw, f"http://ok{nxt}.test:{gw.plain.port}/t{i}",
                                  user=user)),
        "other-secret": codes(curl(gw, f"https://sec{nxt}.test/t{i}", "--cacert",
                                   str(me.ca), user=user)),
    }


def _records(keys: TenantKeys) -> Counter[tuple[str, str]]:
    lines = [json.loads(line) for line in keys.record.read_text().splitlines()]
    # Every line names its tenant, and a tenant's own record names no other.
    assert {line["tenant"] for line in lines} <= {keys.name}, keys.name
    return Counter((line["host"], line["verdict"]) for line in lines)


def test_fifty_tenants_each_judged_by_its_own_policy_with_no_cross_injection(
        gw: Gateway) -> None:
    for keys in gw.tenants.values():
        keys.record.write_text("")
    seen_before = len(gw.tls.seen)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _tenant_traffic(gw, i), range(TENANTS)))
    for i, result in enumerate(results):
        assert result["secret"][0] == "200", (i, result)
        assert result["allowed-socks"][0] == "200", (i, result)
        assert result["other-allow"][0] == "403", (i, result)  # plain HTTP: the proxy answers
        assert result["other-secret"][1] == "403", (i, result)  # CONNECT refused
    # At the stand-in: each request carries exactly its own tenant's canary.
    canaries = {k.canary for k in gw.tenants.values()}
    seen = gw.tls.seen[seen_before:]
    assert len(seen) == TENANTS
    for request in seen:
        name = request["path"].lstrip("/")
        values = [v for k, v in request["headers"] if k.lower() == "x-canary"]
        assert values == [gw.tenants[name].canary], request["path"]
        assert not [k for k, _ in request["headers"] if k.lower().startswith("proxy-")]
        text = json.dumps(request["headers"])
        assert sum(c in text for c in canaries) == 1
    # Each record holds its own tenant's four decisions, no one else's.
    for i in range(TENANTS):
        nxt = (i + 1) % TENANTS
        assert _records(gw.tenants[f"t{i}"]) == Counter({
            (f"sec{i}.test", "allowed"): 1, (f"ok{i}.test", "allowed"): 1,
            (f"ok{nxt}.test", "refused"): 1, (f"sec{nxt}.test", "refused"): 1}), i


def test_add_and_remove_under_load_drops_no_other_tenants_connection(gw: Gateway) -> None:
    kept = [gw.add(f"keep{i}", TENANTS + i, allow_echo=True) for i in range(8)]
    doomed = gw.add("doomed", TENANTS + 20, allow_echo=True)
    tunnels = [open_tunnel(gw, k.name, k.password) for k in kept]
    doomed_tunnel, status = open_tunnel(gw, doomed.name, doomed.password)
    assert status.startswith(b"HTTP/1.1 200"), status
    assert all(s.startswith(b"HTTP/1.1 200") for _, s in tunnels)
    failures: list[str] = []
    stop = threading.Event()

    def pump(n: int, sock: socket.socket) -> None:
        rounds = 0
        while not stop.is_set() or rounds < 3:
            payload = f"{n}:{rounds}:".encode() * 100
            if echo_once(sock, payload) != payload:
                failures.append(f"tunnel {n} lost at round {rounds}")
                return
            rounds += 1

    pumps = [threading.Thread(target=pump, args=(n, s)) for n, (s, _) in enumerate(tunnels)]
    for thread in pumps:
        thread.start()
    churn = [gw.add(f"churn{i}", TENANTS + 10 + i) for i in range(10)]
    for keys in churn[:5]:
        assert gw.request({"op": "remove", "tenant": keys.name}) == {
            "ok": True, "tenant": keys.name, "closed": 0}
        del gw.tenants[keys.name]
    removed = gw.request({"op": "remove", "tenant": "doomed"})
    assert removed == {"ok": True, "tenant": "doomed", "closed": 1}
    del gw.tenants["doomed"]
    time.sleep(0.3)
    stop.set()
    for thread in pumps:
        thread.join(30)
    assert failures == []
    # The removed tenant's own tunnel is closed; the others still echo.
    doomed_tunnel.settimeout(5)
    assert echo_once(doomed_tunnel, b"after removal") == b""
    for n, (sock, _) in enumerate(tunnels):
        assert echo_once(sock, b"still here %d" % n) == b"still here %d" % n
        sock.close()
    doomed_tunnel.close()
    listed = {t["tenant"] for t in gw.request({"op": "list"})["tenants"]}
    assert "doomed" not in listed and {k.name for k in churn[5:]} <= listed


def _new_lines(gw: Gateway, before: int) -> list[str]:
    """The log's lines after the first ``before``, once one came (the client may see
    a refusal before the proxy has written its line), and a moment for a second."""
    deadline = time.monotonic() + 5
    while len(gw.proxy.log_text().splitlines()) <= before and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)
    return gw.proxy.log_text().splitlines()[before:]


def test_bad_missing_and_replayed_credentials_get_407_and_one_log_line(gw: Gateway) -> None:
    keys = gw.add("replay", TENANTS + 30)
    url = f"http://ok{TENANTS + 30}.test:{gw.plain.port}/replay"
    good = f"replay:{keys.password}"
    assert codes(curl(gw, url, user=good)) == ("200", "000")
    assert gw.request({"op": "remove", "tenant": "replay"})["ok"]
    del gw.tenants["replay"]
    cases = {
        "missing": (None, "proxy credentials required"),
        "bad": (f"replay:{keys.password[:-1]}x", "wrong proxy credentials"),
        "unknown": (f"nobody:{keys.password}", "wrong proxy credentials"),
        "replayed": (good, "wrong proxy credentials"),
    }
    for name, (user, reason) in cases.items():
        before = len(gw.proxy.log_text().splitlines())
        done = curl(gw, url, "-i", user=user)
        assert codes(done)[0] == "407", name
        assert 'proxy-authenticate: basic realm="egress-proxy"' in done.stdout.lower(), name
        lines = _new_lines(gw, before)
        assert len(lines) == 1 and f"reason=407 {reason}" in lines[0], (name, lines)
        # Through CONNECT too: refused before any tunnel.
        before = len(gw.proxy.log_text().splitlines())
        done = curl(gw, f"https://sec{TENANTS + 30}.test/", user=user)
        assert codes(done)[1] == "407", name
        assert len(_new_lines(gw, before)) == 1, name
        # And SOCKS5: the RFC 1929 failure reply.
        before = len(gw.proxy.log_text().splitlines())
        done = curl(gw, url, user=user, socks=True)
        assert done.returncode == 97 if user else done.returncode != 0, (name, done.stderr)
        lines = _new_lines(gw, before)
        assert len(lines) == 1 and "reason=socks:" in lines[0], (name, lines)
    text = gw.proxy.log_text()
    for tenant in gw.tenants.values():
        assert tenant.password not in text
    assert keys.password not in text


def test_the_credential_never_reaches_upstream(gw: Gateway) -> None:
    me = gw.tenants["t3"]
    user = f"t3:{me.password}"
    assert codes(curl(gw, f"http://ok3.test:{gw.plain.port}/plain", user=user))[0] == "200"
    plain = gw.plain.seen[-1]
    assert plain["path"] == "/plain"
    assert not [k for k, _ in plain["headers"] if k.lower().startswith("proxy-")]
    # Inside an intercepted tunnel, a Proxy-Authorization the client adds is dropped too.
    done = curl(gw, "https://sec3.test/inner", "--cacert", str(me.ca),
                "-H", f"Proxy-Authorization: Basic {me.password}", user=user)
    assert codes(done)[0] == "200"
    inner = gw.tls.seen[-1]
    assert inner["path"] == "/inner"
    assert me.password not in json.dumps(inner["headers"])


def test_control_socket_is_0600_and_refuses_another_uid(gw: Gateway) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
    from as_user import ordinary_user

    assert os.stat(gw.control).st_mode & 0o777 == 0o600
    user = ordinary_user()
    if user.unavailable or os.geteuid() != 0:
        pytest.skip(user.unavailable or "needs root to switch uid")
    # The test's own tmp dirs are 0700: the other uid reaches the socket through a
    # second link to it (same inode, same mode) in a directory it may traverse.
    reachable = Path(tempfile.mkdtemp(prefix="gw-control-"))
    reachable.chmod(0o711)
    link = reachable / "control.sock"
    os.link(gw.control, link)

    def try_control() -> int:
        """In the child: 1 no entry, 2 refused by uid, 3 served, 4 another error."""
        data = b""
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(str(link))
                while chunk := sock.recv(4096):  # the gateway speaks first to a stranger
                    data += chunk
        except PermissionError:
            return 1
        except OSError:
            return 4
        return 2 if b"is not the gateway's uid" in data else 3

    assert user.call(try_control) == 1  # the file mode alone keeps it out
    before = len(gw.proxy.log_text().splitlines())
    os.chmod(gw.control, 0o666)  # past the mode, SO_PEERCRED still refuses
    try:
        assert user.call(try_control) == 2
    finally:
        os.chmod(gw.control, 0o600)
        link.unlink()
        reachable.rmdir()
    assert any("control: refused a peer of uid" in line for line in _new_lines(gw, before))


def test_malformed_frames_get_a_clear_error_and_the_connection_stays(gw: Gateway) -> None:
    frames = [
        (b"not json", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"op": "frobnicate"}', '"op" must be one of'),
        (b'{"op": "add", "tenant": "bad name"}', '"tenant" must be'),
        (b'{"op": "add", "tenant": "x", "password": "short"}', '"password" must be'),
        (b'{"op": "add", "tenant": "x", "policy": {"allow": 5}}', "policy 'allow' must be"),
        (b'{"op": "add", "tenant": "x", "policy": {"bogus": "1"}}', "unknown policy key"),
        (b'{"op": "add", "tenant": "x", "policy": {"allow": "a..b"}}', ""),
        (b'{"op": "add", "tenant": "t1"}', "tenant t1 exists"),
        (b'{"op": "remove", "tenant": "nobody"}', "no tenant nobody"),
        (b'{"op": "list", "extra": 1}', "unknown key 'extra'"),
        (b"\xff\xfe", "not a JSON object"),
    ]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(gw.control)
        reader = sock.makefile("rb")
        for frame, wanted in frames:
            sock.sendall(frame + b"\n")
            answer = json.loads(reader.readline())
            assert answer["ok"] is False and wanted in answer["error"], (frame, answer)
        sock.sendall(b'{"op": "list"}\n')
        assert json.loads(reader.readline())["ok"] is True
        sock.sendall(b"x" * (70 * 1024) + b"\n")
        answer = json.loads(reader.readline())
        assert answer == {"ok": False, "error": "request line longer than 65536 bytes"}
        assert reader.readline() == b""
    assert gw.proxy.proc.poll() is None


def test_tenant_options_on_the_command_line_are_refused_in_gateway_mode(
        tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(["egress-proxy", "--listen", "127.0.0.1:0", "--control",
                           str(tmp_path / "c"), "--allow", "example.com"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert "--allow is a tenant's option with --control" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_kept_alive_connection_stays_with_its_first_tenant(gw: Gateway) -> None:
    from gateway_rig import basic

    a, b = gw.tenants["t5"], gw.tenants["t6"]
    with socket.create_connection(("127.0.0.1", gw.proxy.port), timeout=10) as sock:
        reader = sock.makefile("rb")

        def ask(keys: TenantKeys, host: str) -> bytes:
            target = f"http://{host}:{gw.plain.port}/kept"
            sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n"
                         f"Proxy-Authorization: {basic(keys.name, keys.password)}\r\n\r\n".encode())
            status = reader.readline()
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            return status

        assert ask(a, "ok5.test").startswith(b"HTTP/1.1 200")
        assert ask(a, "ok5.test").startswith(b"HTTP/1.1 200")
        before = len(gw.proxy.log_text().splitlines())
        # t6's own host with t6's valid credential, on t5's connection: refused.
        assert ask(b, "ok6.test").startswith(b"HTTP/1.1 407")
        lines = _new_lines(gw, before)
        assert len(lines) == 1 and "proxy credentials changed" in lines[0]
        assert reader.readline() == b""  # and the connection ends


def test_a_tenant_over_its_max_conns_is_refused_and_the_others_are_not(gw: Gateway) -> None:
    capped = gw.add("capped", TENANTS + 35, allow_echo=True, max_conns=2)
    held = [open_tunnel(gw, capped.name, capped.password) for _ in range(2)]
    assert all(status.startswith(b"HTTP/1.1 200") for _, status in held)
    before = len(gw.proxy.log_text().splitlines())
    extra, status = open_tunnel(gw, capped.name, capped.password)
    extra.close()
    assert status.startswith(b"HTTP/1.1 503"), status
    lines = _new_lines(gw, before)
    assert len(lines) == 1 and "limit" in lines[0] and "more than 2 connections" in lines[0]
    socks_done = curl(gw, f"http://echo.test:{gw.echo_port}/", socks=True,
                      user=f"capped:{capped.password}")
    assert socks_done.returncode != 0
    other = gw.tenants["t7"]
    assert codes(curl(gw, f"http://ok7.test:{gw.plain.port}/",
                      user=f"t7:{other.password}"))[0] == "200"
    held[0][0].close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the proxy notices the close
        again, status = open_tunnel(gw, capped.name, capped.password)
        again.close()
        if status.startswith(b"HTTP/1.1 200"):
            break
        time.sleep(0.05)
    assert status.startswith(b"HTTP/1.1 200")
    held[1][0].close()


def test_two_adds_of_one_name_at_once_make_one_tenant(gw: Gateway) -> None:
    slow = gw.tmp / "slow.secrets.json"
    slow.write_text(json.dumps([{"host": "slow.test", "header": "x-canary",
                                 "command": "sh -c 'sleep 0.5; echo SLOW'"}]))
    frame = {"op": "add", "tenant": "twice", "policy": {"inject": "", "secrets": str(slow)}}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: gw.request(frame), range(2)))
    assert sorted(a["ok"] for a in answers) == [False, True], answers
    refused = next(a for a in answers if not a["ok"])
    assert refused["error"] == "tenant twice exists: remove it first"
    assert gw.request({"op": "remove", "tenant": "twice"})["ok"]


def test_tenants_sharing_one_record_stream_are_told_apart_by_their_tag(gw: Gateway) -> None:
    """Three tenants write to one record file (as to a pod's stdout): each line names its
    tenant, and the lines of each are exactly its own traffic's."""
    shared = gw.tmp / "shared.record.jsonl"
    names = ["share-a", "share-b", "share-c"]
    keys = [gw.add(name, TENANTS + 30 + n, record=str(shared)) for n, name in enumerate(names)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda n: (
            codes(curl(gw, f"http://ok{TENANTS + 30 + n}.test:{gw.plain.port}/x",
                       user=f"{keys[n].name}:{keys[n].password}")),
            codes(curl(gw, f"http://ok{TENANTS + 30 + (n + 1) % 3}.test:{gw.plain.port}/x",
                       user=f"{keys[n].name}:{keys[n].password}"))), range(3)))
    for own, other in results:
        assert own[0] == "200" and other[0] == "403", results
    lines = [json.loads(line) for line in shared.read_text().splitlines()]
    assert len(lines) == 6
    for n, name in enumerate(names):
        mine = Counter((line["host"], line["verdict"]) for line in lines
                       if line["tenant"] == name)
        assert mine == Counter({(f"ok{TENANTS + 30 + n}.test", "allowed"): 1,
                                (f"ok{TENANTS + 30 + (n + 1) % 3}.test", "refused"): 1}), name
        assert list(lines[0])[:2] == ["ev", "tenant"]
    for name in names:
        assert gw.request({"op": "remove", "tenant": name})["ok"]
