"""Benchmark: session start with the resident service, without it, and ``srt -c true``.

In one run, interleaved, N times each, on each backend:

- ``agent-sandbox run -- true`` with ``agent-sandbox serve`` running, warm
  (the run has no terminal: the service's launcher zygote forks it; its CPU
  is the zygote's reaped children's, counted in the service's share);
- the same with ``AGENT_SANDBOX_WARM=off`` (the launcher starts its own
  interpreter; the session is still a tenant of its gateway: no
  egress-proxy of its own);
- the same with ``AGENT_SANDBOX_SERVE=off`` (the session starts its own);
- ``true`` on the host (the floor);
- Anthropic's ``srt -c true`` when installed (on PATH, or
  ``.bench/node_modules/.bin/srt`` from ``npm install --prefix .bench
  @anthropic-ai/sandbox-runtime``).

Wall time is the whole run (start, ``true``, end).  CPU is user + system of the
launcher and everything it reaped (``wait4``): the servers, the sandbox, the
janitor.  With the service, the session's broker is the service's zygote's
child, not the launcher's: the service's, its gateway's and its zygote's CPU
(the zygote's reaped children, the brokers, included) during each run is added
per session ("+ service"), and the ratios count it: the CPU figure with the
service is the launcher's tree plus that share.

Goals (issue 29): with the service <= 0.5x srt's wall time and <= 1.0x its CPU;
without <= 0.6x wall.  A small git repository is the workdir.
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

N = int(os.environ.get("BENCH_N", "11"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {"with service": (0.5, 1.0), "warm": (0.5, 1.0), "own servers": (0.6, None)}


def _srt() -> str | None:
    found = shutil.which("srt")
    local = os.path.join(ROOT, ".bench", "node_modules", ".bin", "srt")
    return found or (local if os.access(local, os.X_OK) else None)


def _run(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall, cpu) seconds of one run; CPU of the process and all it reaped."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode(errors='replace')[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime


def _ticks(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` so far, its reaped children included."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _service_cpu(pids: list[int]) -> float:
    return sum(_ticks(pid) for pid in pids)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            out += [int(p) for p in fh.read().split()]
    return out


def _start_service(tmp: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], list[int]]:
    sock = os.path.join(tmp, "serve.sock")
    log = open(os.path.join(tmp, "serve.log"), "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(["agent-sandbox", "serve", f"--socket={sock}"], env=env,
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(os.path.join(tmp, "serve.log"), "rb") as fh:
            if b"serving:" in fh.read():
                return proc, [proc.pid, *_children(proc.pid)]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit("agent-sandbox serve did not start: see " + os.path.join(tmp, "serve.log"))


def main() -> int:
    # The project's .pyc files, as `just setup` and any installed package have them: with
    # PYTHONDONTWRITEBYTECODE set, each start would otherwise compile what it imports.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "bin", "libbroker", "libpolicy",
                    "libegress"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    subprocess.run(["git", "init", "-q", work], check=True)
    with open(os.path.join(work, "README"), "w") as fh:
        fh.write("bench\n")
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX")}
    env["XDG_STATE_HOME"] = os.path.join(tmp, "state")  # the records land here, not in ~
    backends = ["bwrap", "nono"] if shutil.which("bwrap") else ["nono"]
    srt = _srt()
    service, pids = _start_service(tmp, env)
    with_env = {**env, "AGENT_SANDBOX_SERVE": os.path.join(tmp, "serve.sock")}
    cold_env = {**with_env, "AGENT_SANDBOX_WARM": "off"}
    own_env = {**env, "AGENT_SANDBOX_SERVE": "off"}
    runs: dict[str, list[tuple[float, float]]] = {}
    shares: dict[str, list[float]] = {}  # the service's CPU during each served run
    try:
        for _ in range(N):
            for b in backends:
                argv = ["agent-sandbox", "run", f"--config={config}", f"--sandbox={b}",
                        "--", "true"]
                for name, served_env in ((f"{b} warm", with_env),
                                         (f"{b} with service", cold_env)):
                    before = _service_cpu(pids)
                    runs.setdefault(name, []).append(_run(argv, served_env, work))
                    time.sleep(0.2)  # the zygotes reap their children (their CPU counts then)
                    shares.setdefault(name, []).append(_service_cpu(pids) - before)
                runs.setdefault(f"{b} own servers", []).append(_run(argv, own_env, work))
            runs.setdefault("host true", []).append(_run(["true"], env, work))
            if srt:
                runs.setdefault("srt -c true", []).append(_run([srt, "-c", "true"], env, work))
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    share = {name: statistics.mean(v) for name, v in shares.items()}
    med = {name: (statistics.median(w for w, _ in v) * 1000,
                  statistics.median(c for _, c in v) * 1000) for name, v in runs.items()}
    for name in share:  # with the service: its share is the session's cost too
        med[name] = (med[name][0], med[name][1] + share[name] * 1000)
    print(f"serve bench: session start, median of {N} interleaved runs each (ms)")
    base = med.get("srt -c true")
    for name, (wall, cpu) in med.items():
        line = f"  {name:<22} wall {wall:7.1f}  cpu {cpu:7.1f}"
        if name in share:
            line += f"  (of it the service's {share[name] * 1000:5.1f})"
        if base and name not in ("srt -c true", "host true"):
            line += f"   {wall / base[0]:4.2f}x srt wall  {cpu / base[1]:4.2f}x srt cpu"
            kind = name.split(" ", 1)[1]
            goal_wall, goal_cpu = GOALS[kind]
            ok = wall / base[0] <= goal_wall and (goal_cpu is None or cpu / base[1] <= goal_cpu)
            goals = f"<= {goal_wall}x wall" + (f", <= {goal_cpu}x cpu" if goal_cpu else "")
            line += f"  goal {goals}: {'ok' if ok else 'missed'}"
        print(line)
    if base is None:
        print("  srt not installed (npm install --prefix .bench @anthropic-ai/sandbox-runtime):"
              " no ratios")
    for b in backends:
        (w1, c1), (w0, c0) = med[f"{b} with service"], med[f"{b} own servers"]
        print(f"  {b}: the service saves {w0 - w1:.0f} ms wall, {c0 - c1:.0f} ms cpu per session"
              f" ({w1 / w0:.2f}x wall, {c1 / c0:.2f}x cpu of own servers, its share counted)")
        (w2, c2) = med[f"{b} warm"]
        print(f"  {b}: the warm launcher saves {w1 - w2:.0f} ms wall, {c1 - c2:.0f} ms cpu per"
              f" session ({w2 / w1:.2f}x wall, {c2 / c1:.2f}x cpu of a cold launcher with the"
              f" service; {w2 / w0:.2f}x wall, {c2 / c0:.2f}x cpu of own servers)")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
