"""egress-proxy benchmark: four figures side by side with their baselines.

1. CONNECT tunnel download (curl): direct vs egress-proxy vs tinyproxy.
2. Injected path (TLS terminated and re-originated): direct vs egress-proxy vs
   mitmproxy's mitmdump doing the same interception (skipped when absent); then
   the same for an upload (curl -T, Content-Length, streamed through h11).
   Side by side in the same proxy and rounds: a ``--secrets`` host (its own
   header from its own command) against the GitHub token's path, for the
   download and for small requests (median of a new connection + GET each).
3. 500 concurrent idle tunnels held, then all used: dropped count, peak RSS.
4. Leaf issuance: first request to a new inject host vs a cached one (median).
5. The session record (``--record``, as the launcher runs it: JSON lines on the
   proxy's stdout, a pipe read by another thread): the tunnel and the injected
   download, and small injected requests, each with and without it, in the same
   run and rounds (interleaved).  ``--record-only`` runs this figure alone.

Everything runs on 127.0.0.1 against a local TLS download server with its own
test CA.  Sizes: EGRESS_BENCH_MIB (default 512 for 1, half of it for 2).
mitmdump is looked up in $MITMDUMP, on PATH, then in .venv-mitmproxy/: install
it in its own venv (mitmproxy 11 pins h11 0.14 and cryptography < 45, older than
this project's), e.g. ``python3 -m venv .venv-mitmproxy && .venv-mitmproxy/bin/pip
install mitmproxy``.
"""

from __future__ import annotations

import asyncio
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
SIZE = int(os.environ.get("EGRESS_BENCH_MIB", "512")) * MIB
ROUNDS = int(os.environ.get("EGRESS_BENCH_ROUNDS", "3"))
TUNNELS = int(os.environ.get("EGRESS_BENCH_TUNNELS", "500"))
LEAF_HOSTS = [f"h{i}.bench.test" for i in range(31)]
SECRET_HOST = "secret.bench.test"
SMALL_REQUESTS = int(os.environ.get("EGRESS_BENCH_SMALL", "60"))


# --- the stand-in servers ------------------------------------------------------


def _discard_upload(tls: ssl.SSLSocket, head: bytes, sink: bytearray) -> None:
    """Read and drop a PUT/POST body (Content-Length), then answer 200."""
    head, _, early = head.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    left = length - len(early)
    while left > 0:
        n = tls.recv_into(sink, min(left, len(sink)))
        if not n:
            raise ConnectionError("the upload ended early")
        left -= n
    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


CHUNK = 16 * 1024  # GET /chunked/N: the chunk size (as a streamed git pack might come)


def _send_chunked(tls: ssl.SSLSocket, n: int, block: memoryview) -> None:
    """N bytes as a chunked body of CHUNK-sized chunks, written 4 MiB of framing at a time."""
    tls.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    frame = b"%x\r\n" % CHUNK + bytes(block[:CHUNK]) + b"\r\n"
    batch = frame * (len(block) // len(frame))
    per = len(batch) // len(frame)
    while n >= CHUNK:
        k = min(n // CHUNK, per)
        tls.sendall(batch[:k * len(frame)])
        n -= k * CHUNK
    if n:
        tls.sendall(b"%x\r\n" % n + bytes(block[:n]) + b"\r\n")
    tls.sendall(b"0\r\n\r\n")


def download_server(cert: str, key: str) -> int:
    """A TLS server answering GET /N with N bytes (4 MiB writes), one thread each.

    GET /chunked/N answers them chunked (_send_chunked).  A PUT or POST
    (Content-Length) is read into a scratch buffer and dropped.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.create_server(("127.0.0.1", 0), backlog=1024)
    block = memoryview(b"x" * (4 * MIB))

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sink = bytearray(4 * MIB)
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                while True:
                    req = b""
                    while b"\r\n\r\n" not in req:
                        chunk = tls.recv(65536)
                        if not chunk:
                            return
                        req += chunk
                    if req.startswith((b"PUT ", b"POST ")):
                        _discard_upload(tls, req, sink)
                        continue
                    target = req.split(b" ")[1]
                    n = int(target.rsplit(b"/", 1)[1] or b"0")
                    if target.startswith(b"/chunked/"):
                        _send_chunked(tls, n, block)
                        continue
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


def echo_server() -> int:
    """A TCP echo server (asyncio, own thread) for the idle-tunnel figure."""
    ready = threading.Event()
    port: list[int] = []

    async def serve() -> None:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=2048)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    ready.wait()
    return port[0]


# --- clients and baselines -------------------------------------------------------


def curl_argv(url: str, resolve: str, cafile: str, proxy: str | None,
              upload: Path | None = None) -> list[str]:
    argv = ["curl", "-sS", "-o", "/dev/null", "--cacert", cafile, "--resolve", resolve, url]
    if upload is not None:
        # No Expect: the stand-in sends no 100, and curl would wait a second for it.
        argv += ["-f", "-T", str(upload), "-H", "Expect:"]
    return argv + (["--proxy", proxy] if proxy else [])


def best_times(contenders: dict[str, list[str] | None]) -> dict[str, float | None]:
    """Best seconds of ROUNDS curl runs each, interleaved so load swings hit all alike."""
    best: dict[str, float | None] = dict.fromkeys(contenders)
    for _ in range(ROUNDS):
        for name, argv in contenders.items():
            if argv is None:
                continue
            start = time.perf_counter()
            subprocess.run(argv, check=True)
            elapsed = time.perf_counter() - start
            previous = best[name]
            best[name] = elapsed if previous is None else min(previous, elapsed)
    return best


def tinyproxy(tmp: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    exe = shutil.which("tinyproxy")
    if exe is None:
        return None
    port = free_port()
    conf = tmp / "tinyproxy.conf"
    conf.write_text(f"Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 2000\n"
                    "User nobody\nGroup nogroup\nLogLevel Critical\n"
                    f"PidFile \"{tmp}/tinyproxy.pid\"\n")
    proc = subprocess.Popen([exe, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, f"http://127.0.0.1:{port}"


def mitmdump(tmp: Path, upstream_port: int, ca: str) -> tuple[subprocess.Popen[bytes], str,
                                                               str] | None:
    candidates = [os.environ.get("MITMDUMP"), shutil.which("mitmdump"),
                  str(REPO / ".venv-mitmproxy" / "bin" / "mitmdump")]
    exe = next((c for c in candidates if c and os.path.exists(c)), None)
    if exe is None:
        return None
    port = free_port()
    addon = tmp / "redirect.py"
    addon.write_text(
        "from mitmproxy import http\n"
        "def server_connect(data):\n"
        f"    data.server.address = ('127.0.0.1', {upstream_port})\n"
        "def request(flow: http.HTTPFlow):\n"
        "    flow.request.headers['Authorization'] = 'Bearer bench-token'\n"
    )
    confdir = tmp / "mitm"
    proc = subprocess.Popen(
        [exe, "-q", "--listen-host", "127.0.0.1", "-p", str(port), "--set", f"confdir={confdir}",
         "--set", f"ssl_verify_upstream_trusted_ca={ca}", "--set", "stream_large_bodies=1m",
         "-s", str(addon)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, 30)
    return proc, f"http://127.0.0.1:{port}", str(confdir / "mitmproxy-ca-cert.pem")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- figure 3: idle tunnels ----------------------------------------------------------


async def hold_tunnels(proxy_port: int, target: str, n: int) -> tuple[int, int]:
    """Open n tunnels, hold them all, then use each; (opened, answered)."""
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", proxy_port)
            w.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
            if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
                w.close()
                return None
            return r, w
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            return None

    for batch in range(0, n, 100):
        opened = await asyncio.gather(*(open_one() for _ in range(min(100, n - batch))))
        conns += [c for c in opened if c is not None]
    await asyncio.sleep(1.0)

    async def use(i: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        msg = f"ping {i}\n".encode()
        try:
            w.write(msg)
            await w.drain()
            return await asyncio.wait_for(r.readexactly(len(msg)), 30) == msg
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            return False

    answered = await asyncio.gather(*(use(i, r, w) for i, (r, w) in enumerate(conns)))
    for _, w in conns:
        w.close()
    return len(conns), sum(answered)


# --- figure 4: leaf issuance -------------------------------------------------------


def timed_request(proxy_port: int, host: str, cafile: str) -> float:
    ctx = ssl.create_default_context(cafile=cafile)
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", proxy_port)) as s:
        s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        with ctx.wrap_socket(s, server_hostname=host) as tls:
            tls.sendall(f"GET /16 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            got = b""
            while not got.endswith(b"x" * 16):
                got += tls.recv(4096)
    return time.perf_counter() - start


# --- figure 5: the session record -------------------------------------------------


def drain(proc: subprocess.Popen[bytes]) -> list[int]:
    """Read ``proc``'s stdout (its --record lines) in a thread, as the launcher does."""
    count = [0]

    def run() -> None:
        assert proc.stdout is not None
        while True:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return
            count[0] += chunk.count(b"\n")

    threading.Thread(target=run, daemon=True).start()
    return count


def record_figure(port: int, resolve: str, cafile: Path, tunnel_args: list[str],
                  inject_args: list[str], tmp: Path) -> None:
    """Figure 5: each path with and without --record, same run, interleaved rounds."""
    rounds = max(ROUNDS, 5)
    off_t = start_proxy(tunnel_args)
    on_t = start_proxy([*tunnel_args, "--record=/dev/stdout"])
    off_i = start_proxy([*inject_args, f"--egress-dir={tmp / 'egress-off'}"])
    on_i = start_proxy([*inject_args, f"--egress-dir={tmp / 'egress-on'}",
                        "--record=/dev/stdout"])
    lines = [drain(on_t.proc), drain(on_i.proc)]
    try:
        url = f"https://127.0.0.1:{port}/{SIZE}"
        half = SIZE // 2
        iurl = f"https://download.test/{half}"
        ires = "download.test:443:127.0.0.1"
        best: dict[str, float] = {}
        for _ in range(rounds):
            for name, argv in (
                ("tunnel off", curl_argv(url, resolve, str(cafile), off_t.http)),
                ("tunnel on", curl_argv(url, resolve, str(cafile), on_t.http)),
                ("injected off", curl_argv(iurl, ires, str(tmp / "egress-off" / "bundle.pem"),
                                           off_i.http)),
                ("injected on", curl_argv(iurl, ires, str(tmp / "egress-on" / "bundle.pem"),
                                          on_i.http)),
            ):
                start = time.perf_counter()
                subprocess.run(argv, check=True)
                elapsed = time.perf_counter() - start
                best[name] = min(best.get(name, elapsed), elapsed)
        small: dict[str, list[float]] = {"off": [], "on": []}
        bundles = {"off": str(tmp / "egress-off" / "bundle.pem"),
                   "on": str(tmp / "egress-on" / "bundle.pem")}
        ports = {"off": off_i.port, "on": on_i.port}
        for key in ("off", "on"):
            timed_request(ports[key], "download.test", bundles[key])
        for _ in range(SMALL_REQUESTS):
            for key in ("off", "on"):
                small[key].append(timed_request(ports[key], "download.test", bundles[key]))
        print(f"5. Session record (--record to a pipe, drained), best of {rounds} interleaved")
        for path, size in (("tunnel", SIZE), ("injected", half)):
            off, on = best[f"{path} off"], best[f"{path} on"]
            print(f"  {path:<9} without {mbps(off, size):6.0f} MB/s   with {mbps(on, size):6.0f}"
                  f" MB/s   slowdown {(on / off - 1) * 100:+5.1f}% (goal <= +3%)")
        s_off, s_on = statistics.median(small["off"]), statistics.median(small["on"])
        print(f"  small injected requests: without {s_off * 1000:6.2f} ms   with "
              f"{s_on * 1000:6.2f} ms   {(s_on / s_off - 1) * 100:+5.1f}% (median of "
              f"{SMALL_REQUESTS})")
        time.sleep(0.2)
        print(f"  record lines written: {lines[0][0]} (tunnel), {lines[1][0]} (injected)")
    finally:
        for p in (off_t, on_t, off_i, on_i):
            p.stop()


# --- the run -------------------------------------------------------------------------


def mbps(seconds: float, size: int) -> float:
    return size / seconds / 1e6


def row(label: str, seconds: float | None, size: int, base: float) -> None:
    if seconds is None:
        print(f"  {label:<28} skipped")
        return
    print(f"  {label:<28} {mbps(seconds, size):8.0f} MB/s   {base / seconds:5.2f}x direct")


def upload_figure(tmp: Path, port: int, resolve: str, cafile: str, bundle: str, proxy: str,
                  size: int) -> None:
    """Figure 2, upload: curl -T of ``size`` bytes, direct vs through the inject path."""
    data = tmp / "upload.bin"
    with data.open("wb") as out:
        block = os.urandom(4 * MIB)
        for _ in range(size // len(block)):
            out.write(block)
    t = best_times({
        "direct": curl_argv(f"https://download.test:{port}/upload", resolve, cafile, None,
                            data),
        "ours": curl_argv("https://download.test/upload", "download.test:443:127.0.0.1",
                          bundle, proxy, data),
    })
    data.unlink()
    direct, ours = t["direct"] or 1.0, t["ours"] or 1.0
    print(f"2u. Injected path, upload of {size // MIB} MiB (curl -T, Content-Length)")
    row("direct", direct, size, direct)
    row("egress-proxy", ours, size, direct)
    print(f"  upload ratio                 {direct / ours:5.2f}x direct (goal >= 0.50x)")


def small_figure(proxy_port: int, bundle: str) -> None:
    """Figure 2s: small requests, the GitHub token's host vs a --secrets host, interleaved."""
    github: list[float] = []
    secret: list[float] = []
    timed_request(proxy_port, "download.test", bundle)  # leaves issued, upstream warm
    timed_request(proxy_port, SECRET_HOST, bundle)
    for _ in range(SMALL_REQUESTS):
        github.append(timed_request(proxy_port, "download.test", bundle))
        secret.append(timed_request(proxy_port, SECRET_HOST, bundle))
    g_med, s_med = statistics.median(github), statistics.median(secret)
    print(f"2s. Injected small requests (new connection + GET, median of {SMALL_REQUESTS})")
    print(f"  GitHub token path  {g_med * 1000:6.2f} ms   --secrets host {s_med * 1000:6.2f} ms"
          f"   ratio {s_med / g_med:5.3f} (goal <= 1.05)")


def main() -> None:
    if shutil.which("curl") is None:
        raise SystemExit("bench/egress.py needs curl")
    tmp = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "download.test", SECRET_HOST, *LEAF_HOSTS)
    cafile, certfile, keyfile = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca.cert_pem.write_to_path(str(cafile))
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    port = download_server(str(certfile), str(keyfile))
    echo = echo_server()
    # Tunnels name the server by address: tinyproxy would otherwise ask DNS.
    resolve = f"download.test:{port}:127.0.0.1"
    print(f"egress bench: download {SIZE // MIB} MiB (tunnel), {SIZE // 2 // MIB} MiB "
          f"(injected), best of {ROUNDS} interleaved; {TUNNELS} idle tunnels; "
          f"load {os.getloadavg()[0]:.1f}")

    pins = [f"--resolve=download.test:127.0.0.1:{port}"]
    pins += [f"--resolve={h}:127.0.0.1:{port}" for h in (SECRET_HOST, *LEAF_HOSTS)]
    if "--record-only" in sys.argv[1:]:
        try:
            record_figure(port, resolve, cafile,
                          [f"--allow=127.0.0.1:{port}", "--allow-cidr=127.0.0.1/32",
                           "--log=/dev/null"],
                          ["--inject=download.test", pins[0], f"--upstream-ca={cafile}",
                           "--token-command=echo bench-token", "--log=/dev/null"], tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    secrets_file = tmp / "secrets.json"
    secrets_file.write_text(json.dumps([{"host": SECRET_HOST, "header": "x-api-key",
                                         "format": "{}", "command": "echo bench-secret"}]))
    proxy = start_proxy([f"--allow=127.0.0.1:{port},127.0.0.1:{echo}",
                         "--allow-cidr=127.0.0.1/32", "--max-conns=4096", "--log=/dev/null"])
    inject = start_proxy(["--inject=download.test," + ",".join(LEAF_HOSTS), *pins,
                          f"--upstream-ca={cafile}", f"--egress-dir={tmp / 'egress'}",
                          "--token-command=echo bench-token", f"--secrets={secrets_file}",
                          "--log=/dev/null"])
    tiny = tinyproxy(tmp)
    mitm = mitmdump(tmp, port, str(cafile))
    try:
        url = f"https://127.0.0.1:{port}/{SIZE}"
        t = best_times({
            "direct": curl_argv(url, resolve, str(cafile), None),
            "ours": curl_argv(url, resolve, str(cafile), proxy.http),
            "tiny": curl_argv(url, resolve, str(cafile), tiny[1]) if tiny else None,
        })
        direct, ours, theirs = t["direct"] or 1.0, t["ours"] or 1.0, t["tiny"]
        print("1. CONNECT tunnel (curl)")
        row("direct", direct, SIZE, direct)
        row("egress-proxy (splice)", ours, SIZE, direct)
        row("tinyproxy", theirs, SIZE, direct)
        if theirs:
            print(f"  egress-proxy / tinyproxy     {theirs / ours:5.2f}x")

        half = SIZE // 2
        iurl = f"https://download.test/{half}"
        bundle = str(tmp / "egress" / "bundle.pem")
        t = best_times({
            "direct": curl_argv(f"https://download.test:{port}/{half}", resolve, str(cafile),
                                None),
            "ours": curl_argv(iurl, "download.test:443:127.0.0.1", bundle, inject.http),
            "secret": curl_argv(f"https://{SECRET_HOST}/{half}", f"{SECRET_HOST}:443:127.0.0.1",
                                bundle, inject.http),
            "mitm": curl_argv(iurl, "download.test:443:127.0.0.1", mitm[2], mitm[1])
            if mitm else None,
        })
        idirect, iours, imitm = t["direct"] or 1.0, t["ours"] or 1.0, t["mitm"]
        print("2. Injected path (TLS terminated + re-originated)")
        row("direct", idirect, half, idirect)
        row("egress-proxy", iours, half, idirect)
        row("egress-proxy, --secrets host", t["secret"], half, idirect)
        if mitm is None:
            print("  mitmdump                     skipped: not installed ($MITMDUMP, PATH, "
                  ".venv-mitmproxy/)")
        else:
            row("mitmdump", imitm, half, idirect)
            if imitm:
                print(f"  egress-proxy / mitmdump      {imitm / iours:5.2f}x")
        isecret = t["secret"] or 1.0
        print(f"  --secrets / GitHub path      {iours / isecret:5.2f}x throughput "
              f"(goal >= 0.95x)")
        small_figure(inject.port, bundle)
        upload_figure(tmp, port, resolve, str(cafile), bundle, inject.http, half)

        print(f"3. {TUNNELS} idle tunnels held, then all used")
        before = peak_rss_mib(proxy.proc.pid)
        opened, answered = asyncio.run(hold_tunnels(proxy.port, f"127.0.0.1:{echo}", TUNNELS))
        print(f"  egress-proxy   opened {opened}, answered {answered}, dropped "
              f"{TUNNELS - answered}; peak RSS {peak_rss_mib(proxy.proc.pid):.1f} MiB "
              f"(before {before:.1f})")
        if tiny:
            t_open, t_ans = asyncio.run(hold_tunnels(int(tiny[1].rsplit(":", 1)[1]),
                                                     f"127.0.0.1:{echo}", TUNNELS))
            print(f"  tinyproxy      opened {t_open}, answered {t_ans}, dropped "
                  f"{TUNNELS - t_ans}")

        print("4. Leaf issuance (first request to a new inject host vs cached, median)")
        timed_request(inject.port, "download.test", bundle)  # warm the upstream path
        first, cached = [], []
        for host in LEAF_HOSTS:
            first.append(timed_request(inject.port, host, bundle))
            cached.append(timed_request(inject.port, host, bundle))
        f_med, c_med = statistics.median(first), statistics.median(cached)
        print(f"  first {f_med * 1000:6.1f} ms   cached {c_med * 1000:6.1f} ms   "
              f"issuance cost {(f_med - c_med) * 1000:+5.1f} ms (target <= 10 ms)")
        record_figure(port, resolve, cafile,
                      [f"--allow=127.0.0.1:{port}", "--allow-cidr=127.0.0.1/32",
                       "--log=/dev/null"],
                      ["--inject=download.test", pins[0], f"--upstream-ca={cafile}",
                       "--token-command=echo bench-token", "--log=/dev/null"], tmp)
    finally:
        for p in (proxy, inject):
            p.stop()
        for other in (tiny, mitm):
            if other:
                other[0].terminate()
                other[0].wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
