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

Two host loops run at once: a shell started *before* the session, in the
workdir (its working directory predates the live gate's mounts: git at the
top opens ``.git/...`` relative to it), and a loop that starts each ``git``
with the workdir named by path.

Side by side in one run: the same planting and host loops with no sandbox
(the baseline: what the loops catch when nothing guards), then per backend
with the watcher alone (``AGENT_SANDBOX_LIVE_GATE=off``) and with the gate
(fanotify; root only).  Printed per row: host iterations (both loops), plant
rounds, plant runs (the canary's lines), and runs per 1000 iterations.

Then the cost, with no plants: a session runs ``git status`` in a loop
inside while the host loops run; per backend, gate off and on, the inside
and host iterations and the ratio on/off.  BENCH_LIVE_SECONDS (10) sets
each row's length.
"""

from __future__ import annotations

import contextlib
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


HOST_SHELL = r"""
n=0
while [ ! -e {stop} ]; do
  touch a.txt; git status --porcelain >/dev/null 2>&1
  [ -e sub2/.git ] && (cd sub2 && git status --porcelain >/dev/null 2>&1)
  n=$((n+1))
done
echo $n > {stop}.n
"""

INSIDE = r"""
end=$(( $(date +%s) + {seconds} )); n=0
while [ "$(date +%s)" -lt "$end" ]; do git status --porcelain >/dev/null; n=$((n+1)); done
echo $n > .inside-rounds
"""


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


def measure(backend: str, seconds: float, tmp: str, *, gate: bool = True,
            inside: str = PLANT) -> tuple[int, int, int, str]:
    """(host iterations, rounds inside, plant runs, the session's stderr) for one row;
    ``backend`` "none": the script runs on the host with no sandbox."""
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SANDBOX", "GIT_"))},
           **GIT_ENV, "HOME": home, "XDG_STATE_HOME": os.path.join(tmp, "state")}
    work = make_workdir(tmp, env)
    canary = os.path.join(tmp, "canary")
    os.makedirs(canary)
    script = inside.format(canary=canary, seconds=int(seconds))
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
    flag = os.path.join(tmp, "stop-shell")
    shell = subprocess.Popen(["sh", "-c", HOST_SHELL.format(stop=flag)], cwd=work, env=host_env)
    if not gate:
        env = {**env, "AGENT_SANDBOX_LIVE_GATE": "off"}
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
        with open(flag, "w"):
            pass
        shell.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with contextlib.suppress(OSError, ValueError), open(flag + ".n") as fh:
        count.append(int(fh.read().strip() or 0))
    with open(os.path.join(canary, "runs"), "a+") as fh:
        fh.seek(0)
        lines = fh.read().splitlines()
    runs = len(lines)
    if os.environ.get("BENCH_LIVE_SHOW"):
        kinds = {k: lines.count(k) for k in dict.fromkeys(lines)}
        print(f"  {backend}: runs by plant: {kinds}", file=sys.stderr)
    rounds = 0
    for name in (".plant-rounds", ".inside-rounds"):
        with contextlib.suppress(OSError, ValueError), open(os.path.join(work, name)) as fh:
            rounds = int(fh.read().strip() or 0)
    return sum(count), rounds, runs, err


def main() -> int:
    backends = [*(["bwrap"] if shutil.which("bwrap") else []), "nono"]
    gate = os.geteuid() == 0  # fanotify permission events need CAP_SYS_ADMIN
    rows = [("no guard", "none", False)] + [
        (f"{b} {kind}", b, on) for b in backends
        for kind, on in (("watcher", False), *((("gate", True),) if gate else ()))]
    print(f"live window: {SECONDS:g} s of planting per row while two host loops run "
          "git status (a shell older than the session, and new processes)")
    print(f"{'row':<14} {'iterations':>10} {'rounds':>8} {'runs':>6} {'runs/1000 it':>13}")
    worst = 0
    for name, backend, on in rows:
        its, rounds, runs, err = _row(backend, on, PLANT)
        rate = 1000 * runs / its if its else 0.0
        print(f"{name:<14} {its:>10} {rounds:>8} {runs:>6} {rate:>13.1f}")
        if backend != "none":
            worst = max(worst, runs) if on or not gate else worst
            if os.environ.get("BENCH_LIVE_SHOW"):
                print(err, file=sys.stderr)
    print(f"goal: 0 plant runs {'with the gate' if gate else 'under a guard'}; "
          f"worst here: {worst}")
    if not gate:
        print("(not root: no gate rows; the watcher's window above is the ordinary user's)")
        return 0
    print(f"\ncost, no plants: {SECONDS:g} s of git status inside while the host loops run "
          "(gate off and on alternated, twice; sums)")
    print(f"{'row':<14} {'inside it':>10} {'host it':>8} {'inside on/off':>14} "
          f"{'host on/off':>12}")
    for backend in backends:
        got = {False: [0, 0], True: [0, 0]}
        for on in (False, True, False, True):
            its, rounds, _, _ = _row(backend, on, INSIDE)
            got[on][0] += rounds
            got[on][1] += its
        off, on_ = got[False], got[True]
        print(f"{backend + ' gate off':<14} {off[0]:>10} {off[1]:>8}")
        print(f"{backend + ' gate on':<14} {on_[0]:>10} {on_[1]:>8} "
              f"{on_[0] / max(off[0], 1):>14.2f} {on_[1] / max(off[1], 1):>12.2f}")
    return 0


def _row(backend: str, gate: bool, inside: str) -> tuple[int, int, int, str]:
    tmp = tempfile.mkdtemp(prefix=f"bench-live-{backend}-")
    try:
        return measure(backend, SECONDS, tmp, gate=gate, inside=inside)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
