"""Benchmark: a whole session launch against its two servers' own start times.

In one run, interleaved, N times each:

- egress-proxy alone: spawn to both ``listening`` lines;
- broker-server alone: spawn to its ``listening`` line;
- ``agent-sandbox run -- true``: the whole session's wall time (start both,
  build the sandbox, run ``true``, end everything, remove the runtime dir),
  once per backend, and again with ``record = false`` (the session record's cost).

Target (issue 6): the bwrap session's median <= 1.3x the slower server's
median start.

Then, paired against Anthropic's ``srt -c true`` (``just bench-setup`` puts it
in ``.bench/``): in each round srt, then ``agent-sandbox run -- true`` on each
backend (own servers: ``AGENT_SANDBOX_SERVE=off``), in a small git
repository; wall time and CPU (the process and all it reaped, ``wait4``); the
ratio session / srt of each round, so a machine whose speed drifts between
rounds still compares like with like; the median ratio and its range.  Goal
(issue 29, without the resident service): <= 0.6x srt's wall time.
``BENCH_PART=srt`` runs only this part.

The FLOOR line is what no launcher of this design can beat: its own
interpreter start (``agent-sandbox --version``) plus both servers' deferred
boots (:func:`libbroker.launcher.boot.deferred_python_argv`, arguments on
stdin at once), started together with nothing else running, to both
``listening``.  The session's ratio minus the floor's is the launcher's own
share; the floor's ratio above 1.0 is structural (interpreter starts, the
servers' imports competing for the cores).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

N = int(os.environ.get("BENCH_N", "15"))
TARGET = 1.3
TP_N = int(os.environ.get("BENCH_TP_N", "3"))
TP_TARGET = 0.6  # the bwrap bridge's download rate against direct (Landlock's was ~0.7x)


def _until_listening(argv: list[str], lines: int, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    seen = 0
    while seen < lines:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"{argv[0]} exited before listening")
        seen += line.startswith(b"listening ")
    took = time.perf_counter() - start
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    return took


def _executor(backend: str) -> str:
    """The backend's broker executor module, warmed before the arguments as the zygote does."""
    from libbroker.sandbox.backends import of

    return of(backend).executor


def _servers_together(tmp: str, i: int, backend: str, env: dict[str, str]) -> float:
    """Both servers' deferred boots, spawned together as the launcher does: to both listening."""
    from libbroker.launcher import boot, prestart

    egress = os.path.join(tmp, f"floor-egress{i}")
    sock = os.path.join(tmp, f"floor{i}.sock")
    work = os.path.join(tmp, "work")
    warm = (*prestart.BROKER_WARM, _executor(backend))
    jobs = [
        (
            boot.deferred_python_argv("egress-proxy", "bin.egress_proxy", prestart.PROXY_WARM),
            ["--listen=127.0.0.1:0", "--socks=127.0.0.1:0", f"--egress-dir={egress}"],
            env,
            2,
        ),
        (
            boot.deferred_python_argv("broker-server", "bin.broker_server", warm),
            [f"--socket={sock}", f"--workdir={work}", f"--sandbox={backend}"],
            {**env, "AGENT_SANDBOX": "1"},
            1,
        ),
    ]
    start = time.perf_counter()
    procs = []
    for argv, args, penv, lines in jobs:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=penv
        )
        procs.append((proc, args, lines))
    for proc, args, _ in procs:
        assert proc.stdin is not None
        proc.stdin.write(boot.encode_args(args))
        proc.stdin.close()
    for proc, _, lines in procs:
        assert proc.stdout is not None
        seen = 0
        while seen < lines:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("a server's deferred boot exited before listening")
            seen += line.startswith(b"listening ")
    took = time.perf_counter() - start
    for proc, _, _ in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return took


SRT_GOAL_WALL = 0.6


def _vs_srt(tmp: str, backends: list[str], env: dict[str, str]) -> None:
    """Session start paired with ``srt -c true``, round by round (see the module's doc)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serve import _run, _srt  # the same measurement as bench/serve.py's

    srt = _srt()
    if srt is None:
        print("paired with srt: srt is not installed (just bench-setup): skipped")
        return
    work = os.path.join(tmp, "repo")
    os.mkdir(work)
    subprocess.run(["git", "init", "-q", work], check=True)
    with open(os.path.join(work, "README"), "w") as fh:
        fh.write("bench\n")
    config = os.path.join(tmp, "repo.toml")
    with open(config, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\n')
    own = {**env, "AGENT_SANDBOX_SERVE": "off"}
    names = {"bwrap": "session bwrap", "nono": "session Landlock"}
    figures: dict[str, list[tuple[float, float]]] = {"srt -c true": []}
    ratios: dict[str, list[tuple[float, float]]] = {names[b]: [] for b in backends}
    for i in range(N):
        order = backends if i % 2 == 0 else list(reversed(backends))
        wall0, cpu0 = _run([srt, "-c", "true"], env, work)
        figures["srt -c true"].append((wall0, cpu0))
        for b in order:
            argv = ["agent-sandbox", "run", f"--config={config}", f"--sandbox={b}", "--", "true"]
            wall, cpu = _run(argv, own, work)
            figures.setdefault(names[b], []).append((wall, cpu))
            ratios[names[b]].append((wall / wall0, cpu / cpu0))
    print(f"session start paired with srt -c true: {N} rounds, a small git repository")
    for name, runs in figures.items():
        wall = statistics.median(w for w, _ in runs) * 1000
        cpu = statistics.median(c for _, c in runs) * 1000
        line = f"  {name:<18} wall {wall:6.0f} ms  cpu {cpu:6.0f} ms"
        if name in ratios:
            rw = sorted(r for r, _ in ratios[name])
            rc = sorted(c for _, c in ratios[name])
            mw, mc = statistics.median(rw), statistics.median(rc)
            verdict = "ok" if mw <= SRT_GOAL_WALL else "missed"
            line += (f"   / srt: wall {mw:4.2f}x ({rw[0]:.2f}-{rw[-1]:.2f}),"
                     f" cpu {mc:4.2f}x ({rc[0]:.2f}-{rc[-1]:.2f});"
                     f" goal <= {SRT_GOAL_WALL}x wall: {verdict}")
        print(line)
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")


def _wall(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')}")
    return took


def _compile_bytecode() -> None:
    """Write the project's .pyc files, as any installed package has them.

    With PYTHONDONTWRITEBYTECODE set (as in some CI shells) an editable
    install otherwise recompiles every module of every process on each run.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.join(root, d) for d in ("bin", "libbroker", "libpolicy", "libegress")]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *dirs], check=False, stdout=subprocess.DEVNULL
    )


def _throughput(tmp: str, backends: list[str], env: dict[str, str]) -> None:
    """MB/s of a 256 MiB TLS download: direct, via the proxy (Landlock), via the bridge (bwrap)."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import trustme

    work = os.path.join(tmp, "tp")
    os.mkdir(work)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(os.path.join(work, "ca.pem"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("dl.test").configure_cert(ctx)
    block = b"x" * (1 << 20)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            n = int(self.path.strip("/"))
            self.send_response(200)
            self.send_header("Content-Length", str(n << 20))
            self.end_headers()
            for _ in range(n):
                self.wfile.write(block)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    config = os.path.join(tmp, "tp.toml")
    with open(config, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\ndomains = ["dl.test"]\n')
        fh.write(f'resolve = ["dl.test:127.0.0.1:{port}"]\n')
    curl = 'curl -s -o /dev/null --cacert ca.pem -w "%{speed_download}" https://dl.test/256'
    direct = f"{curl} --connect-to dl.test:443:127.0.0.1:{port}"
    names = {"bwrap": "via the bridge (bwrap)", "nono": "via the proxy (Landlock)"}
    rates: dict[str, list[float]] = {"direct": []}
    for b in reversed(backends):
        rates[names[b]] = []
    # Interleaved rounds, medians: one 256 MiB download is at the mercy of the
    # other helpers' load on this 2-core machine.
    for _ in range(TP_N):
        rates["direct"].append(_rate(["sh", "-c", direct], work, None))
        for b in reversed(backends):
            argv = ["agent-sandbox", "run", f"--config={config}", f"--sandbox={b}", "--"]
            rates[names[b]].append(_rate([*argv, "sh", "-c", curl], work, env))
    server.shutdown()
    med = {name: statistics.median(v) / 1e6 for name, v in rates.items()}
    base = med["direct"] or 1.0
    print(f"download throughput, 256 MiB over TLS from a local server (MB/s, median of {TP_N})")
    for name, mbs in med.items():
        print(f"  {name:<26} {mbs:8.0f} MB/s   {mbs / base:5.2f}x direct")
    if "bwrap" in backends:
        ratio = med[names["bwrap"]] / base
        verdict = "ok" if ratio >= TP_TARGET else "UNDER TARGET"
        print(f"  bridge / direct = {ratio:.2f}x (>= {TP_TARGET}x): {verdict}")


def _rate(argv: list[str], cwd: str, env: dict[str, str] | None) -> float:
    """curl's speed_download (bytes/s) of one run; 0 when it printed none."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    try:
        return float(done.stdout)
    except ValueError:
        sys.stderr.write(f"bench: {argv[-1][:40]}... failed: {done.stderr[-300:]}\n")
        return 0.0


def main() -> int:
    _compile_bytecode()
    tmp = tempfile.mkdtemp(prefix="bench-launcher-")
    if os.environ.get("BENCH_PART") == "srt":  # only the pairing with srt
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX")}
        env["XDG_STATE_HOME"] = os.path.join(tmp, "state")
        try:
            _vs_srt(tmp, ["bwrap", "nono"] if shutil.which("bwrap") else ["nono"], env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\n')
    # The same session without its record (record = false), interleaved: what the
    # record costs a session's wall time.
    unrecorded = os.path.join(tmp, "unrecorded.toml")
    with open(unrecorded, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\nrecord = false\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX")}
    env["XDG_STATE_HOME"] = os.path.join(tmp, "state")  # the records land here, not in ~
    backends = ["bwrap", "nono"] if shutil.which("bwrap") else ["nono"]
    times: dict[str, list[float]] = {"egress-proxy": [], "broker-server": []}
    for b in backends:
        times[f"session {b}"] = []
        times[f"session {b} no record"] = []
    srt = shutil.which("srt")
    if srt:
        times["srt -c true"] = []
    # The floor under any Python launcher: its own interpreter start (with
    # site, as a console script runs) and the version of ours.
    times["python3 -c pass"] = []
    times["agent-sandbox --version"] = []
    times["servers together"] = []  # deferred boots, nothing else running
    try:
        for i in range(N):
            egress = os.path.join(tmp, f"egress{i}")
            times["egress-proxy"].append(
                _until_listening(
                    [
                        "egress-proxy",
                        "--listen=127.0.0.1:0",
                        "--socks=127.0.0.1:0",
                        f"--egress-dir={egress}",
                    ],
                    2,
                    env,
                )
            )
            sock = os.path.join(tmp, f"b{i}.sock")
            times["broker-server"].append(
                _until_listening(
                    [
                        "broker-server",
                        f"--socket={sock}",
                        f"--workdir={work}",
                        f"--sandbox={backends[0]}",
                    ],
                    1,
                    env,
                )
            )
            for b in backends:
                for name, cfg in ((f"session {b}", config),
                                  (f"session {b} no record", unrecorded)):
                    times[name].append(
                        _wall(
                            ["agent-sandbox", "run", f"--config={cfg}", f"--sandbox={b}",
                             "--", "true"],
                            env,
                            work,
                        )
                    )
            if srt:
                times["srt -c true"].append(_wall([srt, "-c", "true"], env, work))
            times["python3 -c pass"].append(_wall([sys.executable, "-c", "pass"], env, work))
            times["agent-sandbox --version"].append(
                _wall(["agent-sandbox", "--version"], env, work)
            )
            times["servers together"].append(_servers_together(tmp, i, backends[0], env))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    med = {name: statistics.median(v) * 1000 for name, v in times.items()}
    slower = max(med["egress-proxy"], med["broker-server"])
    print(f"launcher bench: median of {N} runs each (ms)")
    for name, ms in med.items():
        print(f"  {name:<24} {ms:8.1f} ms   {ms / slower:5.2f}x the slower server")
    ratio = med[f"session {backends[0]}"] / slower
    verdict = "ok" if ratio <= TARGET else "OVER TARGET"
    first = backends[0]
    print(f"  session {first} / slower server start = {ratio:.2f}x (<= {TARGET}x): {verdict}")
    own = med[f"session {first}"] - slower
    start = med["agent-sandbox --version"]
    print(f"  the session adds {own:.0f} ms to the slower server's start; the launcher's own")
    print(f"  interpreter start (agent-sandbox --version) is {start:.0f} ms of that")
    floor = start + med["servers together"]
    print(
        f"  FLOOR = agent-sandbox --version + servers together = {floor:.0f} ms"
        f" = {floor / slower:.2f}x the slower server; session {first} = {ratio:.2f}x;"
        f" the launcher's own share {ratio - floor / slower:+.2f}x"
    )
    for b in backends:
        cost = med[f"session {b}"] - med[f"session {b} no record"]
        print(f"  session record, {b}: {cost:+.1f} ms of a session's wall time (median)")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (2 cores; figures scale with it)")
    try:
        _vs_srt(tmp, backends, env)
        _throughput(tmp, backends, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
