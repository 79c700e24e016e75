"""egress-proxy bench: the GitHub token's injected path with ``--repos`` vs without.

Two proxies, the same arguments but ``--repos=acme/widgets``, against one
local TLS stand-in for api.github.com (its own test CA), in the same run,
rounds interleaved:

1. download throughput (curl, GET /N: a read, judged on its request line);
2. small GETs (a new connection + GET each, median);
3. small REST writes on one kept-alive connection (POST /repos/acme/widgets/issues,
   judged on its request line; median per request);
4. gh's createIssue mutation on one kept-alive connection (POST /graphql: with
   --repos the body is read, parsed, and its repository id checked against the
   listed repositories' ids, looked up once and cached; median per request).

Sizes: EGRESS_BENCH_MIB (default 256), EGRESS_BENCH_ROUNDS (3),
EGRESS_BENCH_SMALL (200).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "egress"))
from egress_proxyproc import start_proxy  # noqa: E402

MIB = 1 << 20
SIZE = int(os.environ.get("EGRESS_BENCH_MIB", "256")) * MIB
ROUNDS = int(os.environ.get("EGRESS_BENCH_ROUNDS", "3"))
SMALL = int(os.environ.get("EGRESS_BENCH_SMALL", "200"))
HOST = "api.github.com"
ISSUE = json.dumps({"title": "t", "body": "b" * 200}).encode()
CREATE_ISSUE = json.dumps({
    "query": "\n    mutation IssueCreate($input: CreateIssueInput!) {\n"
             "        createIssue(input: $input) {\n            issue {\n"
             "                id\n                url\n            }\n        }\n    }",
    "variables": {"input": {"repositoryId": "R_bench", "title": "t", "body": "b" * 200}},
}).encode()


def stand_in(cert: str, key: str) -> int:
    """api.github.com: GET /N answers N bytes; POST reads its body and answers JSON.

    POST /graphql answers every query with the listed repository's id, so the
    proxy's lookup finds R_bench.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.create_server(("127.0.0.1", 0), backlog=1024)
    block = memoryview(b"x" * (4 * MIB))
    answer = json.dumps({"data": {"r0": {"id": "R_bench"},
                                  "createIssue": {"issue": {"id": "I_1"}}}}).encode()

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = tls.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    if head.startswith(b"POST "):
                        length = next(int(line.split(b":", 1)[1])
                                      for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length:"))
                        while len(buf) < length:
                            buf += tls.recv(65536)
                        buf = buf[length:]
                        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
                        continue
                    n = int(head.split(b" ")[1].rsplit(b"/", 1)[1] or b"0")
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                    while n > 0:
                        k = min(n, len(block))
                        tls.sendall(block[:k])
                        n -= k
        except (OSError, ssl.SSLError, ValueError):
            pass

    def accept() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(srv.getsockname()[1])


def tunnel(proxy_port: int, cafile: str) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=cafile)
    s = socket.create_connection(("127.0.0.1", proxy_port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    return ctx.wrap_socket(s, server_hostname=HOST)


def roundtrip(tls: ssl.SSLSocket, method: str, path: str, body: bytes = b"") -> int:
    head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    tls.sendall(head.encode() + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += tls.recv(65536)
    head_bytes, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head_bytes.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += tls.recv(65536)
    return status


def new_connection_get(proxy_port: int, cafile: str) -> float:
    start = time.perf_counter()
    with tunnel(proxy_port, cafile) as tls:
        assert roundtrip(tls, "GET", "/16") == 200
    return time.perf_counter() - start


def per_request(tls: ssl.SSLSocket, method: str, path: str, body: bytes) -> float:
    start = time.perf_counter()
    status = roundtrip(tls, method, path, body)
    assert status == 200, status
    return time.perf_counter() - start


def curl_seconds(proxy: str, bundle: str) -> float:
    argv = ["curl", "-sS", "-o", "/dev/null", "--cacert", bundle, "--proxy", proxy,
            f"https://{HOST}/{SIZE}"]
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - start


def main() -> None:
    if shutil.which("curl") is None:
        raise SystemExit("bench/egress_repos.py needs curl")
    tmp = Path(tempfile.mkdtemp(prefix="egress-repos-bench-"))
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    cafile, certfile, keyfile = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca.cert_pem.write_to_path(str(cafile))
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    port = stand_in(str(certfile), str(keyfile))
    common = [f"--inject={HOST}", f"--resolve={HOST}:127.0.0.1:{port}",
              f"--upstream-ca={cafile}", "--token-command=echo bench-token", "--log=/dev/null"]
    plain = start_proxy([*common, f"--egress-dir={tmp / 'plain'}"])
    scoped = start_proxy([*common, f"--egress-dir={tmp / 'scoped'}", "--repos=acme/widgets"])
    names = {"without --repos": (plain, str(tmp / "plain" / "bundle.pem")),
             "with --repos": (scoped, str(tmp / "scoped" / "bundle.pem"))}
    print(f"egress --repos bench: download {SIZE // MIB} MiB best of {ROUNDS}, "
          f"{SMALL} small requests each, interleaved; load {os.getloadavg()[0]:.1f}")
    try:
        best: dict[str, float] = {}
        for _ in range(ROUNDS):
            for name, (proxy, bundle) in names.items():
                t = curl_seconds(proxy.http, bundle)
                best[name] = min(best.get(name, t), t)
        gets: dict[str, list[float]] = {n: [] for n in names}
        posts: dict[str, list[float]] = {n: [] for n in names}
        mutations: dict[str, list[float]] = {n: [] for n in names}
        conns = {n: tunnel(p.port, b) for n, (p, b) in names.items()}
        for name, tls in conns.items():  # warm: leaves issued, lookups cached
            per_request(tls, "POST", "/graphql", CREATE_ISSUE)
            new_connection_get(names[name][0].port, names[name][1])
        for _ in range(SMALL):
            for name, (proxy, bundle) in names.items():
                gets[name].append(new_connection_get(proxy.port, bundle))
                posts[name].append(per_request(conns[name], "POST",
                                               "/repos/acme/widgets/issues", ISSUE))
                mutations[name].append(per_request(conns[name], "POST", "/graphql",
                                                   CREATE_ISSUE))
        for tls in conns.values():
            tls.close()
        base = "without --repos"
        print(f"  {'':<38}{'without':>12}{'with':>12}{'ratio':>9}")

        def line(label: str, a: float, b: float, unit: str, ratio: float) -> None:
            print(f"  {label:<38}{a:>9.2f} {unit}{b:>9.2f} {unit}{ratio:>9.3f}")

        a, b = SIZE / best[base] / 1e6, SIZE / best["with --repos"] / 1e6
        line("1. download (GET, MB/s)", a, b, "  ", b / a)
        for label, series in (("2. new connection + GET (ms, median)", gets),
                              ("3. REST POST, kept alive (ms, median)", posts),
                              ("4. GraphQL createIssue (ms, median)", mutations)):
            a, b = (statistics.median(series[n]) * 1000 for n in (base, "with --repos"))
            line(label, a, b, "  ", b / a)
    finally:
        for proxy, _ in names.values():
            proxy.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
