"""Benchmark: the host-run guard's cost at session start and end (issue 24).

``agent-sandbox run -- true`` on two workdirs, an empty one and a big one
(100k files in 5k directories, 50 repositories at depths 1 to 4, each with
git's sample hooks), on both backends, interleaved, N times each, three ways:

- ``off``: no guard at all.  The launcher runs with the guard replaced by a
  stand-in that scans nothing and sweeps nothing (a bench-only switch, below:
  the product has none), and ``protect_git = false`` (no live guard);
- ``sweep``: the scan at start and the sweep at the end, ``protect_git = false``;
- ``full``: the default (scan, sweep, and the live guard: bwrap's held
  configs, the watcher, and as root the live gate); ``full-nogate`` the same
  with ``AGENT_SANDBOX_LIVE_GATE=off``.

From ``AGENT_SANDBOX_TRACE``'s lines: *start* is the launcher's ms to ``go``
(the command may run), *end* the ms from ``command ended`` to ``clean``.
Printed: medians, and each guarded way against ``off`` (delta ms and ratio).
Goal (issue 24): at most +50 ms at session end on the big tree.

``BENCH_HR_BEFORE=<a checkout>`` adds ``sweep@before``, ``full@before`` (and as
root ``full-nogate@before``): the same sessions with that checkout's code first on
PYTHONPATH (``git archive <commit> | tar -x -C DIR``, then ``python -m
libbroker.native`` there), in the same interleaved run: a change's before and after
side by side.  ``BENCH_HR_TREES=big`` and ``BENCH_HR_WAYS=full,full@before`` (``off``
always runs) narrow a run to what a change touches, for more rounds in the same time.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = int(os.environ.get("BENCH_N", "5"))
BEFORE = os.environ.get("BENCH_HR_BEFORE", "")
FILES = int(os.environ.get("BENCH_HR_FILES", "100000"))  # smaller for a smoke run
DIRS, REPOS = max(FILES // 20, 50), 50
END_GOAL_MS = 50.0
# A focused run: BENCH_HR_TREES=big, BENCH_HR_WAYS=off,full,full@before (default: all)
TREES = [t for t in os.environ.get("BENCH_HR_TREES", "empty,big").split(",") if t]
WAYS = [w for w in os.environ.get("BENCH_HR_WAYS", "").split(",") if w]

# The bench-only "off" switch: the session's guard is a stand-in with an empty snapshot.
OFF = """
import sys
from libbroker.launcher import hostrun_guard
from libbroker.launcher.hostrun_fingerprint import Snapshot

class NoGuard:
    def __init__(self, workdir, table, runtime_dir, state):
        self.snap = Snapshot(workdir, "off", table)
    def wait(self):
        return self.snap
    def finish(self, out=2, quiet=None):
        return []

hostrun_guard.Guard = NoGuard
from bin.agent_sandbox import main
sys.argv[0] = "agent-sandbox"
main()
"""


def _git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd), "GIT_AUTHOR_NAME": "b",
           "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def build_big(work: Path, template: Path) -> None:
    """100k files in 5k directories (fan-out 10, depth 4), 50 repositories among them."""
    per_dir = FILES // DIRS
    dirs = []
    for i in range(DIRS):
        d = work / f"a{i % 10}" / f"b{i // 10 % 10}" / f"c{i // 100 % 10}" / f"d{i // 1000}"
        d.mkdir(parents=True, exist_ok=True)
        for j in range(per_dir):
            (d / f"f{j}.txt").write_bytes(b"x")
        dirs.append(d)
    template.mkdir()
    _git(template, "init", "-q")
    (template / "README").write_text("r\n")
    _git(template, "add", ".")
    _git(template, "commit", "-q", "-m", "r")
    for r in range(REPOS):
        at = dirs[r * (DIRS // REPOS)]
        for _ in range(r % 4):
            at = at.parent
        repo = at / f"repo{r}"
        repo.mkdir()
        shutil.copytree(template / ".git", repo / ".git")


RUN = """
import sys
from bin.agent_sandbox import main
sys.argv[0] = "agent-sandbox"
main()
"""


def session(cfg: Path, home: Path, rt: Path, backend: str, off: bool,
            code: str = "", gate: bool = True) -> tuple[float, float, float]:
    """(start ms, end ms, wall ms) of one ``agent-sandbox run -- true`` (``code``: a checkout
    to run instead of the installed one)."""
    # Every way is launched alike (the interpreter with this checkout, or ``code``, first on
    # PYTHONPATH): a console script against ``python -c`` made before and after differ.
    head = [sys.executable, "-c", OFF if off else RUN]
    code = code or str(Path(__file__).resolve().parents[1])
    argv = [*head, "run", f"--config={cfg}", f"--sandbox={backend}", "--", "true"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "AGENT_SANDBOX"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(rt), AGENT_SANDBOX_TRACE="1")
    if code:
        env["PYTHONPATH"] = code
    if not gate:
        env["AGENT_SANDBOX_LIVE_GATE"] = "off"
    t0 = time.perf_counter()
    # Not from the checkout: ``python -c`` puts the working directory first on sys.path,
    # ahead of PYTHONPATH, so run from a repository's root every ``@before`` way ran the
    # current code.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=home)
    wall = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise SystemExit(f"session failed ({backend}, off={off}):\n{done.stderr[-2000:]}")
    marks: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if line.startswith("agent-sandbox: trace "):
            ms, what = line.split()[2], line.split(") ", 1)[1]
            marks[what.split(":")[0]] = float(ms)
    return marks["go"], marks["clean"] - marks["command ended"], wall


def main() -> None:
    if not shutil.which("agent-sandbox"):
        raise SystemExit("agent-sandbox is not on PATH (pip install -e .)")
    backends = [b for b in ("bwrap", "nono") if b != "bwrap" or shutil.which("bwrap")]
    base = Path(tempfile.mkdtemp(prefix="as-bench-hr-", dir="/tmp"))
    try:
        home, rt = base / "home", base / "rt"
        (home / ".config").mkdir(parents=True)
        (home / ".config/token").write_text("t\n")
        rt.mkdir(mode=0o700)
        trees = {t: base / t for t in TREES}
        (base / "empty").mkdir()
        t = time.perf_counter()
        build_big(base / "big", base / "template")
        print(f"built the big tree in {time.perf_counter() - t:.1f} s "
              f"({FILES} files, {DIRS} dirs, {REPOS} repositories); N={N}; load average "
              + " ".join(f"{x:.1f}" for x in os.getloadavg()))
        ways = {"off": (True, False, ""), "sweep": (False, False, ""), "full": (False, True, "")}
        if os.geteuid() == 0:  # the live gate (fanotify) runs as root only: also without it
            ways["full-nogate"] = (False, True, "")
        if BEFORE:
            ways.update({"sweep@before": (False, False, BEFORE),
                         "full@before": (False, True, BEFORE)})
            if os.geteuid() == 0:
                ways["full-nogate@before"] = (False, True, BEFORE)
        if WAYS:
            ways = {w: ways[w] for w in ["off", *WAYS] if w in ways}
        cfgs = {}
        for tree, work in trees.items():
            for way, (_, protect, _) in ways.items():
                cfgs[tree, way] = base / f"{tree}-{way}.toml"
                cfgs[tree, way].write_text(
                    f'workdir = "{work}"\ntoken_command = "cat {home}/.config/token"\n'
                    f"protect_git = {'true' if protect else 'false'}\nrecord = false\n")
        got: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
        for _ in range(N):  # interleaved: the machine's drift hits every way alike
            for backend in backends:
                for tree in trees:
                    for way, (off, _, code) in ways.items():
                        run = session(cfgs[tree, way], home, rt, backend, off, code,
                                      gate=not way.startswith("full-nogate"))
                        got.setdefault((backend, tree, way), []).append(run)
        report(got, backends, list(trees), list(ways))
        print("load average at the end: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def report(got: dict[tuple[str, str, str], list[tuple[float, float, float]]],
           backends: list[str], trees: list[str], ways: list[str]) -> None:
    print(f"{'backend':7} {'tree':6} {'way':18} {'start ms':>9} {'end ms':>8} {'wall ms':>8}"
          f"   {'start vs off':>16} {'end vs off':>16}")
    worst_end = 0.0
    for backend in backends:
        for tree in trees:
            base = [statistics.median(x) for x in zip(*got[backend, tree, "off"], strict=True)]
            for way in ways:
                med = [statistics.median(x) for x in zip(*got[backend, tree, way], strict=True)]
                cmp = ""
                if way != "off":
                    ds, de = med[0] - base[0], med[1] - base[1]
                    cmp = (f"   {ds:+7.0f} ({med[0] / base[0]:4.2f}x)"
                           f" {de:+7.0f} ({med[1] / max(base[1], 0.1):4.2f}x)")
                    if tree == "big" and "@" not in way:
                        worst_end = max(worst_end, de)
                print(f"{backend:7} {tree:6} {way:18} {med[0]:9.0f} {med[1]:8.0f} {med[2]:8.0f}"
                      + cmp)
    verdict = "met" if worst_end <= END_GOAL_MS else "NOT met"
    print(f"goal: at most +{END_GOAL_MS:.0f} ms at session end on the big tree: worst "
          f"{worst_end:+.0f} ms, {verdict}")


if __name__ == "__main__":
    main()
