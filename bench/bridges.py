"""The one bridge into a bwrap sandbox's network namespace against no bridge, same run.

libbroker/sandbox/bridge.py: the host opens the port inside the sandbox's
namespace and splices each connection to the host's port; the broker's proxy
mode and the session both use it.  A client inside a fresh bwrap talks to a
sink on the host's loopback through it; the baseline is the same client on
the host, connecting to the sink directly.  Figures: connection set-up
(N connects, one byte there and back, median) and throughput at 64 KiB,
4 MiB and 64 MiB (sent, counted, acknowledged; best of 3).

This bench chose the bridge: the two it replaced (the broker's netns listener
with an asyncio copy, and the session's in-sandbox forwarder handed a host
connection over a unix socket) were measured side by side with this one;
the figures are in docs/benchmarks.md.
Run: ``python3 bench/bridges.py [--quick]``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from libbroker.sandbox import bridge, bwrap  # noqa: E402

SIZES = (64 << 10, 4 << 20, 64 << 20)
NAMES = ("direct", "bridge")
CLIENT = r"""
import json, socket, struct, sys, time
port, n, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
def once(size, chunk=b"x" * (1 << 20)):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack("!Q", size))
        left = size
        while left:
            left -= s.send(chunk[: min(left, len(chunk))])
        got = b""
        while len(got) < 8:
            more = s.recv(8 - len(got))
            if not more:
                raise SystemExit("sink closed early")
            got += more
        assert struct.unpack("!Q", got)[0] == size
once(1)
connects = []
for _ in range(n):
    t = time.perf_counter(); once(1); connects.append(time.perf_counter() - t)
rates = {}
for size in sizes:
    best = None
    for _ in range(3):
        t = time.perf_counter(); once(size); d = time.perf_counter() - t
        best = d if best is None else min(best, d)
    rates[size] = size / best
print(json.dumps({"connects": connects, "rates": rates}))
"""


def sink() -> socket.socket:
    """A host server: reads an 8-byte size then that many bytes, answers the size."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=128)

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while len(head) < 8:
                more = conn.recv(8 - len(head))
                if not more:
                    return
                head += more
            (size,) = struct.unpack("!Q", head)
            left = size
            while left:
                data = conn.recv(min(left, 1 << 20))
                if not data:
                    return
                left -= len(data)
            conn.sendall(struct.pack("!Q", size))

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv


def client_argv(script: str, port: int, n: int, sizes: tuple[int, ...]) -> list[str]:
    return [sys.executable, "-I", "-S", script, str(port), str(n), ",".join(map(str, sizes))]


def run_direct(script: str, port: int, n: int, sizes: tuple[int, ...]) -> dict:
    done = subprocess.run(client_argv(script, port, n, sizes), capture_output=True, check=True)
    return json.loads(done.stdout)


def run_bridge(script: str, port: int, n: int, sizes: tuple[int, ...]) -> dict:
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    proc = subprocess.Popen(
        ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
         "--proc", "/proc", "--info-fd", str(info_w), "--block-fd", str(block_r), "--",
         *client_argv(script, port, n, sizes)],
        pass_fds=(info_w, block_r), stdout=subprocess.PIPE,
    )  # fmt: skip
    os.close(info_w)
    os.close(block_r)
    inner = bwrap.read_info(info_r)
    os.close(info_r)
    assert inner is not None, "bwrap failed"
    [listener] = bridge.listen_in_netns(inner, (port,))
    relay = bridge.Bridge(listener, port)
    os.write(block_w, b"go")
    os.close(block_w)
    out, _ = proc.communicate()
    relay.close()
    return json.loads(out)


def main() -> int:
    if not shutil.which("bwrap"):
        print("bench/bridges.py: bwrap is not installed; skipped")
        return 0
    quick = "--quick" in sys.argv
    n = 50 if quick else 300
    sizes = SIZES[:2] if quick else SIZES
    srv = sink()
    port = srv.getsockname()[1]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(CLIENT)
        script = fh.name
    results: dict[str, dict] = {}
    try:
        for round_ in range(2):  # alternate, so drift in the machine's load hits both
            for name in NAMES:
                run = run_direct if name == "direct" else run_bridge
                got = run(script, port, n, sizes)
                if round_ == 1:
                    results[name] = got
    finally:
        os.unlink(script)
        srv.close()
    print(f"the bridge into bwrap's netns vs direct (load {os.getloadavg()[0]:.1f})")
    print(f"{'':22}{'direct':>12}{'bridge':>12}{'ratio':>8}")
    ca, cb = (statistics.median(results[name]["connects"]) for name in NAMES)
    print(f"{'connect+1 B, median':22}{ca * 1e6:>9.0f} us{cb * 1e6:>9.0f} us{cb / ca:>8.2f}")
    for size in sizes:
        ra, rb = (results[name]["rates"][str(size)] for name in NAMES)
        label = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        print(f"{'throughput ' + label:22}{ra / 1e6:>7.0f} MB/s{rb / 1e6:>7.0f} MB/s"
              f"{rb / ra:>8.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
