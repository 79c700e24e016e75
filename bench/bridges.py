"""The two bridges into a bwrap sandbox's network namespace, side by side, same run.

- ``netns``: the broker's proxy mode (libbroker/sandbox/netns.py): the host
  opens the port inside the namespace (setns in a forked child) and copies
  each connection to the host's port in its asyncio loop;
- ``forwarder``: the session's (libbroker/sandbox/forwarder.py inside,
  libbroker/launcher/relay.py outside): the forwarder listens inside, gets a
  TCP connection the host made, passed over a bind-mounted unix socket, and
  splices between the two itself;
- ``netns+splice``: a candidate, the first's listener with the second's
  pump (the host accepts in a thread, connects, and splices both ways).

Each bridge carries a client inside a fresh bwrap to a sink on the host's
loopback: connection set-up (N connects, one byte there and back, median)
and throughput at 64 KiB, 4 MiB and 64 MiB (sent, counted, acknowledged).
Run: ``python3 bench/bridges.py [--quick]``.
"""

from __future__ import annotations

import asyncio
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

from libbroker.launcher.relay import Relay  # noqa: E402
from libbroker.sandbox import forwarder, netns  # noqa: E402

SIZES = (64 << 10, 4 << 20, 64 << 20)
NAMES = ("netns", "forwarder", "netns+splice")
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
for _ in range(20):  # the bridge may still be opening its port
    try:
        once(1)
        break
    except OSError:
        time.sleep(0.01)
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


def sink() -> tuple[socket.socket, threading.Thread]:
    """A host server: reads an 8-byte size then that many bytes, answers the size."""
    srv = socket.create_server(("127.0.0.1", 0))

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

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return srv, thread


BASE = ["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
        "--proc", "/proc"]  # fmt: skip


def client_argv(script: str, port: int, n: int, sizes: tuple[int, ...]) -> list[str]:
    return [sys.executable, "-I", "-S", script, str(port), str(n), ",".join(map(str, sizes))]


async def run_netns(script: str, port: int, n: int, sizes: tuple[int, ...]) -> dict:
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    proc = subprocess.Popen(
        ["bwrap", *BASE, "--info-fd", str(info_w), "--block-fd", str(block_r), "--",
         *client_argv(script, port, n, sizes)],
        pass_fds=(info_w, block_r), stdout=subprocess.PIPE,
    )  # fmt: skip
    os.close(info_w)
    os.close(block_r)
    data = b""
    while b"child-pid" not in data or not data.rstrip().endswith(b"}"):
        data += os.read(info_r, 4096)
    os.close(info_r)
    inner = int(json.loads(data)["child-pid"])
    listener = netns.listen_in_netns(inner, port)
    relay = netns.ProxyRelay(listener, port)
    os.write(block_w, b"go")
    os.close(block_w)
    out = await asyncio.get_running_loop().run_in_executor(None, proc.communicate)
    relay.close()
    return json.loads(out[0])


def run_netns_splice(script: str, port: int, n: int, sizes: tuple[int, ...]) -> dict:
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    proc = subprocess.Popen(
        ["bwrap", *BASE, "--info-fd", str(info_w), "--block-fd", str(block_r), "--",
         *client_argv(script, port, n, sizes)],
        pass_fds=(info_w, block_r), stdout=subprocess.PIPE,
    )  # fmt: skip
    os.close(info_w)
    os.close(block_r)
    data = b""
    while b"child-pid" not in data or not data.rstrip().endswith(b"}"):
        data += os.read(info_r, 4096)
    os.close(info_r)
    listener = netns.listen_in_netns(int(json.loads(data)["child-pid"]), port)
    listener.setblocking(True)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", port))
            for sock in (conn, up):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            forwarder.pump(conn, up)  # type: ignore[arg-type]

    threading.Thread(target=accept, daemon=True).start()
    os.write(block_w, b"go")
    os.close(block_w)
    out, _ = proc.communicate()
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    return json.loads(out)


def run_forwarder(script: str, port: int, n: int, sizes: tuple[int, ...]) -> dict:
    tmp = tempfile.mkdtemp(prefix="bridge-bench-")
    path = os.path.join(tmp, "proxy.sock")
    relay = Relay(path)
    relay.start(port)
    control_r, control_w = os.pipe()
    proc = subprocess.Popen(
        ["bwrap", *BASE, "--", sys.executable, "-I", "-S", forwarder.__file__,
         "--listen", f"{port}={path}", "--control", str(control_r), "--",
         *client_argv(script, port, n, sizes)],
        pass_fds=(control_r,), stdout=subprocess.PIPE,
    )  # fmt: skip
    os.close(control_r)
    os.write(control_w, b"g")
    out, _ = proc.communicate()
    os.close(control_w)
    relay.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return json.loads(out)


def main() -> int:
    if not shutil.which("bwrap"):
        print("bench/bridges.py: bwrap is not installed; skipped")
        return 0
    quick = "--quick" in sys.argv
    n = 50 if quick else 300
    sizes = SIZES[:2] if quick else SIZES
    srv, _ = sink()
    port = srv.getsockname()[1]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(CLIENT)
        script = fh.name
    try:
        results = {}
        for round_ in range(2):  # alternate, so drift in the machine's load hits both
            for name in NAMES:
                if name == "netns":
                    got = asyncio.run(run_netns(script, port, n, sizes))
                elif name == "forwarder":
                    got = run_forwarder(script, port, n, sizes)
                else:
                    got = run_netns_splice(script, port, n, sizes)
                if round_ == 1:
                    results[name] = got
    finally:
        os.unlink(script)
        srv.close()
    print(f"bridges into bwrap's netns (load {os.getloadavg()[0]:.1f}; ratios against netns)")
    print(f"{'':22}" + "".join(f"{name:>14}" for name in NAMES) + f"{'ratios':>14}")
    base = results["netns"]
    cells = [statistics.median(results[name]["connects"]) for name in NAMES]
    ratios = " ".join(f"{c / cells[0]:.2f}" for c in cells[1:])
    print(f"{'connect+1 B, median':22}" + "".join(f"{c * 1e6:>11.0f} us" for c in cells)
          + f"{ratios:>14}")  # fmt: skip
    for size in sizes:
        rates = [results[name]["rates"][str(size)] for name in NAMES]
        label = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        ratios = " ".join(f"{r / rates[0]:.2f}" for r in rates[1:])
        print(f"{'throughput ' + label:22}" + "".join(f"{r / 1e6:>9.0f} MB/s" for r in rates)
              + f"{ratios:>14}")  # fmt: skip
    del base
    return 0


if __name__ == "__main__":
    sys.exit(main())
