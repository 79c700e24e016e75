"""Benchmark: session start with and without resource limits, side by side in one run.

Interleaved, N times each and per backend, ``agent-sandbox run -- true`` with
the default limits and with every limit off (``--limit=tasks=off
--limit=memory=off``: no group is made).  Whole sessions are noisy (two
servers start on two cores), so the launcher's own cost is also measured
directly: the mechanism's discovery, the group's creation and record, the
move of a waiting tree and the removal, in this process (``AGENT_SANDBOX_TRACE``
shows the same step as "limits set").  Target (issue 19): <= 2 ms.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from libbroker.sandbox import limits

N = int(os.environ.get("BENCH_N", "15"))
OFF = ["--limit=tasks=off", "--limit=memory=off"]


def _session(argv: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench: {argv} failed: {done.stderr.decode(errors='replace')}")
    return (time.perf_counter() - started) * 1000


def _own_cost(rounds: int = 50) -> tuple[float, float]:
    """Median ms of (discover + create + record, move a waiting process + remove)."""
    setup, rest = [], []
    with tempfile.TemporaryDirectory() as rt:
        for _ in range(rounds):
            limits._chosen = None  # discovery counted every time, as in a fresh launcher
            t0 = time.perf_counter()
            group = limits.create(limits.Limits(), "bench")
            limits.record(group, rt)
            t1 = time.perf_counter()
            waiting = subprocess.Popen(["sleep", "5"])
            t2 = time.perf_counter()
            limits.move_tree(group, waiting.pid)
            waiting.kill()
            waiting.wait()
            limits.remove(group)
            t3 = time.perf_counter()
            setup.append((t1 - t0) * 1000)
            rest.append((t3 - t2) * 1000)
    return statistics.median(setup), statistics.median(rest)


def main() -> int:
    backends = [b for b in ("bwrap", "nono") if b != "bwrap" or subprocess.run(
        ["sh", "-c", "command -v bwrap"], capture_output=True).returncode == 0]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as fh:
            fh.write(f'workdir = "{work}"\ntoken_command = ""\n')
        env = {**os.environ, "HOME": tmp}
        times: dict[str, list[float]] = {}
        for _ in range(N):
            for b in backends:
                base = ["agent-sandbox", "run", f"--config={config}", f"--sandbox={b}"]
                times.setdefault(f"{b} limits", []).append(
                    _session([*base, "--", "true"], env, work)
                )
                times.setdefault(f"{b} no limits", []).append(
                    _session([*base, *OFF, "--", "true"], env, work)
                )
    print(f"session start with and without limits ({limits.mechanism().describe()}), "
          f"median of {N}:")  # fmt: skip
    for b in backends:
        on, off = (
            statistics.median(times[f"{b} limits"]),
            statistics.median(times[f"{b} no limits"]),
        )
        print(f"  {b:5}  limits {on:6.1f} ms   no limits {off:6.1f} ms   delta {on - off:+5.1f} ms")
    setup, rest = _own_cost()
    print(
        f"  the launcher's own cost: {setup:.2f} ms to set the limits (discover, create, "
        f"record), {rest:.2f} ms to move the sandbox in and remove the group; target <= 2 ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
