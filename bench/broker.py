"""Broker benchmark: the five figures of issue 2, side by side with their baselines.

Run: python3 bench/broker.py [--sandbox=nono|bwrap|both] [--mib=N] [--runs=N]

1. `broker-client -- true` median wall vs `python3 -c pass`      (goal <= 2.5x)
2. sandboxed spawn+wait of `true` in the server vs a plain spawn   (goal <= +10 ms)
3. `broker-client -- cat F` > /dev/null vs `cat F | cat`           (goal >= 0.8x throughput)
4. `cat F | broker-client -- wc -c` vs `cat F | wc -c`             (goal >= 0.6x)
   (3 and 4: best of 3, ours and the baseline alternated; client start included)
5. 100 concurrent `sh -c 'sleep 0.5; echo $0' N`: outputs right, wall (goal <= 1.5 s)
   5 drives 100 connections from threads of this process (the broker's own
   concurrency); 5b starts 100 broker-client processes at once, which on a
   2-core machine mostly measures 100 Python starts.

1, 3 and 4 are also shown (1b, 3b, 4b) for broker-client started from a
`python -I -S` script (libbroker.native.start_script): the console script pays for
site and every .pth file of this environment (here an editable install's
finder and an injected certifi hook), which is not the client's own cost.

F is --mib MiB (default 1024: a 256 MiB page-cached file read 4 times).
Figure 2 spawns through the executor in this process (the same code the
server runs), against a plain posix_spawn of `true`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from libbroker.broker import client
from libbroker.broker.profile import default_profile
from libbroker.native.start_script import start_script
from libbroker.wire import Request

BIN = os.path.dirname(sys.executable)
CLIENT = os.path.join(BIN, "broker-client")
SERVER = os.path.join(BIN, "broker-server")


def median_wall(argv: list[str], runs: int, **kw: object) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def best_pair(ours: str, base: str, env: dict[str, str], runs: int = 3) -> tuple[float, float]:
    """Best wall of each shell command, run alternately so both meet the same load.

    Best-of, not median: on a shared 2-core machine the best run is the one
    least disturbed by other work, which is what a throughput figure means.
    """
    a, b = [], []
    for _ in range(runs):
        for cmd, out in ((ours, a), (base, b)):
            t = time.perf_counter()
            subprocess.run(["bash", "-c", cmd], env=env, stdout=subprocess.DEVNULL, check=True)
            out.append(time.perf_counter() - t)
    return min(a), min(b)


class Server:
    def __init__(self, sandbox: str, workdir: str) -> None:
        self.path = os.path.join(workdir, ".broker.sock")
        self.proc = subprocess.Popen(
            [SERVER, f"--socket={self.path}", f"--workdir={workdir}", f"--sandbox={sandbox}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening"), line

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def spawn_cost(sandbox: str, workdir: str, runs: int) -> tuple[float, float]:
    """Median ms of spawn+wait of `true`: in-process executor vs a plain posix_spawn."""
    from libbroker.broker.executor_choice import make_executor

    executor = make_executor(sandbox, default_profile(), workdir, os.environ)
    null = os.open(os.devnull, os.O_RDWR)
    true = shutil.which("true") or "/bin/true"
    plain, boxed = [], []
    try:
        for _ in range(runs):
            t = time.perf_counter()
            pid = os.posix_spawn(true, ["true"], {}, file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
            os.waitpid(pid, 0)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            child = executor.spawn(("true",), workdir, (null, null, null))
            os.waitpid(child.pid, 0)
            boxed.append(time.perf_counter() - t)
            child.release()
    finally:
        executor.close()
        os.close(null)
    return statistics.median(plain) * 1e3, statistics.median(boxed) * 1e3


def concurrent(path: str, workdir: str, count: int) -> tuple[float, int]:
    """`count` connections at once, each from its own thread; wall and wrong outputs."""
    wrong = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal wrong
        r, w = os.pipe()
        req = Request(("sh", "-c", "sleep 0.5; echo $0", str(i)), workdir, with_stdin=False)
        status = client.call(req, path=path, stdin_fd=None, stdout_fd=w, forward_signals=())
        os.close(w)
        out = os.read(r, 100)
        os.close(r)
        if status != 0 or out != f"{i}\n".encode():
            with lock:
                wrong += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, wrong


def concurrent_processes(env: dict[str, str], workdir: str, count: int) -> tuple[float, int]:
    """`count` broker-client processes at once (Python start included)."""
    t = time.perf_counter()
    procs = [
        subprocess.Popen(
            [CLIENT, "-n", "--", "sh", "-c", "sleep 0.5; echo $0", str(i)],
            stdout=subprocess.PIPE, env=env, cwd=workdir,
        )
        for i in range(count)
    ]  # fmt: skip
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t
    wrong = sum(1 for i, o in enumerate(outs) if o != f"{i}\n".encode())
    return wall, wrong


def row(label: str, ours: str, base: str, ratio: str, goal: str) -> None:
    print(f"  {label:<44} {ours:>12} {base:>12} {ratio:>9}   {goal}")


def run(sandbox: str, mib: int, runs: int) -> None:
    workdir = tempfile.mkdtemp(prefix="bench-broker-")
    try:
        _run(sandbox, mib, runs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(sandbox: str, mib: int, runs: int, workdir: str) -> None:
    server = Server(sandbox, workdir)
    env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=server.path)
    fast = os.path.join(workdir, "broker-client-fast")
    with open(fast, "w") as fh:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        fh.write(start_script(sys.executable, root, "bin.broker_client", "broker-client"))
    os.chmod(fast, 0o755)
    print(f"== sandbox {sandbox}")
    row("figure", "broker", "baseline", "ratio", "goal")
    try:
        ours = median_wall([CLIENT, "-n", "--", "true"], runs, env=env, cwd=workdir)
        base = median_wall([sys.executable, "-c", "pass"], runs)
        row("1 broker-client -- true (ms, median)", f"{ours*1e3:.1f}", f"{base*1e3:.1f}",
            f"{ours/base:.2f}x", "<= 2.5x")  # fmt: skip
        ours = median_wall([fast, "-n", "--", "true"], runs, env=env, cwd=workdir)
        row("1b same, -I -S start script (ms, median)", f"{ours*1e3:.1f}", f"{base*1e3:.1f}",
            f"{ours/base:.2f}x", "<= 2.5x")  # fmt: skip

        plain, boxed = spawn_cost(sandbox, workdir, runs)
        row("2 spawn+wait true in server (ms, median)", f"{boxed:.2f}", f"{plain:.2f}",
            f"+{boxed-plain:.2f}ms", "<= +10 ms")  # fmt: skip

        chunk = min(mib, 256)
        reps = max(1, mib // chunk)
        data = os.path.join(workdir, "data")
        with open(data, "wb") as fh:
            block = os.urandom(1 << 20)
            for _ in range(chunk):
                fh.write(block)
        files = " ".join(["data"] * reps)
        size = chunk * reps
        cd = f"cd {workdir} && "
        ours, base = best_pair(
            cd + f"{CLIENT} -n -- cat {files} >/dev/null", cd + f"cat {files} | cat >/dev/null", env
        )
        row(f"3 cat {size} MiB out of the broker (MiB/s)", f"{size/ours:.0f}", f"{size/base:.0f}",
            f"{base/ours:.2f}x", ">= 0.8x")  # fmt: skip
        ours, base = best_pair(
            cd + f"{fast} -n -- cat {files} >/dev/null", cd + f"cat {files} | cat >/dev/null", env
        )
        row("3b same, -I -S start script (MiB/s)", f"{size/ours:.0f}", f"{size/base:.0f}",
            f"{base/ours:.2f}x", ">= 0.8x")  # fmt: skip
        ours, base = best_pair(
            cd + f"cat {files} | {CLIENT} -- wc -c", cd + f"cat {files} | wc -c", env
        )
        row(f"4 {size} MiB into the broker | wc -c (MiB/s)", f"{size/ours:.0f}",
            f"{size/base:.0f}", f"{base/ours:.2f}x", ">= 0.6x")  # fmt: skip
        ours, base = best_pair(cd + f"cat {files} | {fast} -- wc -c", cd + f"cat {files} | wc -c",
                               env)  # fmt: skip
        row("4b same, -I -S start script (MiB/s)", f"{size/ours:.0f}", f"{size/base:.0f}",
            f"{base/ours:.2f}x", ">= 0.6x")  # fmt: skip

        wall, wrong = concurrent(server.path, workdir, 100)
        row("5 100 concurrent sleep 0.5 (s, in-process)", f"{wall:.2f}", "0.50",
            f"{wrong} wrong", "<= 1.5 s, 0 wrong")  # fmt: skip
        wall, wrong = concurrent_processes(env, workdir, 100)
        row("5b same, 100 broker-client processes (s)", f"{wall:.2f}", "0.50",
            f"{wrong} wrong", "(Python start x100)")  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandbox", default="both", choices=["nono", "bwrap", "both"])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"bench/broker.py: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    for sandbox in (["nono", "bwrap"] if args.sandbox == "both" else [args.sandbox]):
        run(sandbox, args.mib, args.runs)


if __name__ == "__main__":
    main()
