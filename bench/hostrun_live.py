"""Benchmark: the live window of the host-run guard (issue 24, goal 0 runs).

A session plants continuously while a host loop runs ``git status`` the way
a person watching the agent does in another terminal.  Each plant, if the
host's git used it, appends a line to a canary file outside the workdir:

- ``core.fsmonitor`` in ``.git/config`` (``git config``: bwrap gives the
  session its private copy, Landlock's watcher rewrites the file);
- a ``post-index-change`` hook in ``.git/hooks`` (git status writes the
  index after each ``touch``; bwrap holds hooks/ read-only);
- a new ``.git/commondir`` naming ``.gitc``, a git dir the session made,
  whose config and hooks carry plants too;
- a new gitlink ``sub2/.git`` (``gitdir: ../.gitc``), with the host running
  ``git -C sub2 status``.

Side by side in one run: the same planting and host loop with no sandbox
(the baseline: what the loop catches when nothing guards), then per
backend.  Printed per row: host iterations, plant rounds, plant runs (the
canary's lines), and runs per 1000 iterations.  BENCH_LIVE_SECONDS (10)
sets each row's length.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

SECONDS = float(os.environ.get("BENCH_LIVE_SECONDS", "10"))
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}

PLANT = r"""
C={canary}
end=$(( $(date +%s) + {seconds} )); n=0
hook() {{ printf '#!/bin/sh\necho %s >> %s/runs\n' "$2" "$C" > "$1" && chmod +x "$1"; }} 2>/dev/null
while [ "$(date +%s)" -lt "$end" ]; do
  git config core.fsmonitor "echo config >> $C/runs; false" 2>/dev/null
  hook .git/hooks/post-index-change hook
  mkdir -p .gitc/objects .gitc/refs .gitc/hooks 2>/dev/null
  [ -e .gitc/HEAD ] || echo 'ref: refs/heads/main' > .gitc/HEAD 2>/dev/null
  printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "echo gitc >> %s/runs; false"\n' \
    "$C" > .gitc/config 2>/dev/null
  hook .gitc/hooks/post-index-change gitc-hook
  echo ../.gitc > .git/commondir 2>/dev/null
  mkdir -p sub2 2>/dev/null && echo 'gitdir: ../.gitc' > sub2/.git 2>/dev/null
  n=$((n+1))
done
echo $n > .plant-rounds
"""


def _git(cwd: str, *args: str, env: dict[str, str]) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=30, check=False)


def make_workdir(tmp: str, env: dict[str, str]) -> str:
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    _git(work, "init", "-q", "-b", "main", env=env)
    with open(os.path.join(work, "a.txt"), "w") as fh:
        fh.write("a\n")
    _git(work, "add", "a.txt", env=env)
    _git(work, "commit", "-q", "-m", "init", env=env)
    return work


def host_loop(work: str, stop: threading.Event, env: dict[str, str]) -> int:
    """What the person runs meanwhile: ``git status`` (and in ``sub2``); iterations."""
    n = 0
    a = os.path.join(work, "a.txt")
    while not stop.is_set():
        os.utime(a)  # a stat change: status refreshes and writes the index (post-index-change)
        _git(work, "status", "--porcelain", env=env)
        if os.path.lexists(os.path.join(work, "sub2", ".git")):
            _git(os.path.join(work, "sub2"), "status", "--porcelain", env=env)
        n += 1
    return n


def measure(backend: str, seconds: float, tmp: str) -> tuple[int, int, int, str]:
    """(host iterations, plant rounds, plant runs, the session's stderr) for one row;
    ``backend`` "none": the plants run on the host with no sandbox."""
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SANDBOX", "GIT_"))},
           **GIT_ENV, "HOME": home, "XDG_STATE_HOME": os.path.join(tmp, "state")}
    work = make_workdir(tmp, env)
    canary = os.path.join(tmp, "canary")
    os.makedirs(canary)
    script = PLANT.format(canary=canary, seconds=int(seconds))
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as fh:
        fh.write(f'workdir = "{work}"\ntoken_command = ""\nrecord = false\n')
    if backend == "none":
        argv = ["sh", "-c", script]
    else:
        argv = ["agent-sandbox", "run", f"--config={config}", f"--sandbox={backend}", "--",
                "sh", "-c", script]
    stop = threading.Event()
    count: list[int] = []
    host_env = {**env, "HOME": os.path.join(tmp, "person")}
    os.makedirs(host_env["HOME"])
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    while not os.path.exists(os.path.join(work, ".git")):
        time.sleep(0.01)
    thread = threading.Thread(target=lambda: count.append(host_loop(work, stop, host_env)))
    thread.start()
    try:
        _, err = proc.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        thread.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(os.path.join(canary, "runs"), "a+") as fh:
        fh.seek(0)
        lines = fh.read().splitlines()
    runs = len(lines)
    if os.environ.get("BENCH_LIVE_SHOW"):
        kinds = {k: lines.count(k) for k in dict.fromkeys(lines)}
        print(f"  {backend}: runs by plant: {kinds}", file=sys.stderr)
    try:
        with open(os.path.join(work, ".plant-rounds")) as fh:
            rounds = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        rounds = 0
    return count[0] if count else 0, rounds, runs, err


def main() -> int:
    backends = ["none", *(["bwrap"] if shutil.which("bwrap") else []), "nono"]
    print(f"live window: {SECONDS:g} s of planting per row while the host loops git status")
    print(f"{'row':<10} {'iterations':>10} {'rounds':>8} {'runs':>6} {'runs/1000 it':>13}")
    worst = 0
    for backend in backends:
        tmp = tempfile.mkdtemp(prefix=f"bench-live-{backend}-")
        try:
            its, rounds, runs, err = measure(backend, SECONDS, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rate = 1000 * runs / its if its else 0.0
        name = "no guard" if backend == "none" else backend
        print(f"{name:<10} {its:>10} {rounds:>8} {runs:>6} {rate:>13.1f}")
        if backend != "none":
            worst = max(worst, runs)
            if os.environ.get("BENCH_LIVE_SHOW"):
                print(err, file=sys.stderr)
    print(f"goal: 0 plant runs under a guard; worst here: {worst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
