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

As root, the same for an ordinary user's sessions (as_user's throwaway uid,
the host loops run as that user too): the watcher alone (no gate service) and
the gate through ``agent-sandbox gate-service``, one service started for these
rows; then the same four with no plants (the cost: iterations inside and on
the host).  BENCH_LIVE_ONLY=user runs the no-guard row and these rows alone.

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
from typing import Any

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
    argv = list(args) if "git" in args else ["git", *args]
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
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


def host_loop(work: str, stop: threading.Event, env: dict[str, str],
              prefix: tuple[str, ...] = ()) -> int:
    """What the person runs meanwhile: ``git status`` (and in ``sub2``); iterations.
    ``prefix``: run as another user (setpriv)."""
    n = 0
    a = os.path.join(work, "a.txt")
    while not stop.is_set():
        with contextlib.suppress(OSError):  # a stat change: status writes the index
            os.utime(a)
        _git(work, *prefix, "git", "status", "--porcelain", env=env)
        if os.path.lexists(os.path.join(work, "sub2", ".git")):
            _git(os.path.join(work, "sub2"), *prefix, "git", "status", "--porcelain", env=env)
        n += 1
    return n


def measure(backend: str, seconds: float, tmp: str, *, gate: bool = True,
            inside: str = PLANT, user: Any = None,
            service: str = "") -> tuple[int, int, int, str]:
    """(host iterations, rounds inside, plant runs, the session's stderr) for one row;
    ``backend`` "none": the script runs on the host with no sandbox.  ``user``: the
    session and the host loops as this ordinary user (as_user), with the gate service
    at ``service`` ("": none, the watcher alone)."""
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
    prefix: tuple[str, ...] = ()
    if user is not None:
        prefix = (f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--")
        prefix = ("setpriv", *prefix)
        env = _as_user(user, tmp, env, argv, service)
        argv = user.argv(argv)
        host_env["HOME"] = home
        flag = os.path.join(canary, "stop-shell")  # the user's shell writes beside it
    shell = subprocess.Popen([*prefix, "sh", "-c", HOST_SHELL.format(stop=flag)], cwd=work,
                             env=host_env)
    if not gate:
        env = {**env, "AGENT_SANDBOX_LIVE_GATE": "off"}
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    while not os.path.exists(os.path.join(work, ".git")):
        time.sleep(0.01)
    thread = threading.Thread(target=lambda: count.append(host_loop(work, stop, host_env,
                                                                    prefix)))
    thread.start()
    try:
        _, err = proc.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        thread.join()
        with open(flag, "w"):
            pass
        os.chmod(flag, 0o666)
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


def _as_user(user: Any, tmp: str, env: dict[str, str], argv: list[str],
             service: str) -> dict[str, str]:
    """The row's files given to ``user``; the session's environment for it."""
    os.chmod(tmp, 0o755)
    run = os.path.join(tmp, "run")
    os.makedirs(run, mode=0o700)
    os.makedirs(os.path.join(tmp, "state"), exist_ok=True)
    user.own(*(os.path.join(tmp, d) for d in ("state", "home", "work", "canary", "person",
                                             "config.toml")), run)
    os.chmod(os.path.join(tmp, "canary"), 0o777)
    bin_dir = os.path.dirname(shutil.which("agent-sandbox") or sys.executable)
    return {**env, "XDG_RUNTIME_DIR": run, "PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin')}",
            "AGENT_SANDBOX_GATE_SOCKET": service or "off", "USER": user.name}


def _user_rows(backends: list[str]) -> list[tuple[str, int, int, int]]:
    """The ordinary user's rows: per backend, the watcher alone, then the gate service;
    planting (PLANT), then with no plants (INSIDE: the cost, rows named "... cost")."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "sandbox"))
    from as_user import ordinary_user

    user = ordinary_user()
    if user.unavailable:
        print(f"(no ordinary user here: {user.unavailable})")
        return []
    top = tempfile.mkdtemp(prefix="bench-gate-service-")
    os.chmod(top, 0o755)
    sock = os.path.join(top, "run", "gate.sock")
    log = open(os.path.join(top, "log"), "wb")  # noqa: SIM115 (the service's stderr)
    service = subprocess.Popen(["agent-sandbox", "gate-service", f"--socket={sock}"],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    rows = []
    try:
        while not os.path.exists(sock) and service.poll() is None:
            time.sleep(0.02)
        for inside, what in ((PLANT, ""), (INSIDE, " cost")):
            for backend in backends:
                for kind, path in (("watcher", ""), ("service", sock)):
                    tmp = tempfile.mkdtemp(prefix=f"bench-live-user-{backend}-")
                    try:
                        its, rounds, runs, err = measure(backend, SECONDS, tmp, user=user,
                                                         service=path, inside=inside)
                    finally:
                        shutil.rmtree(tmp, ignore_errors=True)
                    if path and "the live gate is off" in err:
                        print(err, file=sys.stderr)
                    rows.append((f"user {backend} {kind}{what}", its, rounds, runs))
    finally:
        service.terminate()
        service.wait(timeout=60)
        log.close()
        shutil.rmtree(top, ignore_errors=True)
    return rows


def main() -> int:
    backends = [*(["bwrap"] if shutil.which("bwrap") else []), "nono"]
    gate = os.geteuid() == 0  # fanotify permission events need CAP_SYS_ADMIN
    rows = [("no guard", "none", False)] + [
        (f"{b} {kind}", b, on) for b in backends
        for kind, on in (("watcher", False), *((("gate", True),) if gate else ()))]
    if os.environ.get("BENCH_LIVE_ONLY") == "user":
        rows = rows[:1]
    print(f"live window: {SECONDS:g} s of planting per row while two host loops run "
          "git status (a shell older than the session, and new processes)")
    print(f"{'row':<21} {'iterations':>10} {'rounds':>8} {'runs':>6} {'runs/1000 it':>13}")
    worst = 0
    for name, backend, on in rows:
        its, rounds, runs, err = _row(backend, on, PLANT)
        rate = 1000 * runs / its if its else 0.0
        print(f"{name:<21} {its:>10} {rounds:>8} {runs:>6} {rate:>13.1f}")
        if backend != "none":
            worst = max(worst, runs) if on or not gate else worst
            if os.environ.get("BENCH_LIVE_SHOW"):
                print(err, file=sys.stderr)
    if gate:  # as root: the ordinary user's rows, with and without the gate service
        for name, its, rounds, runs in _user_rows(backends):
            rate = 1000 * runs / its if its else 0.0
            print(f"{name:<21} {its:>10} {rounds:>8} {runs:>6} {rate:>13.1f}")
            worst = max(worst, runs) if name.endswith("service") else worst
        print("(the \"cost\" rows: no plants; rounds are the session's own git status runs "
              "inside, iterations the host's)")
    print(f"goal: 0 plant runs {'with the gate' if gate else 'under a guard'}; "
          f"worst here: {worst}")
    if os.environ.get("BENCH_LIVE_ONLY") == "user":
        return 0
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
