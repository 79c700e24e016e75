"""Benchmark: what asking git costs a session's start (docs/git.md).

Interleaved, N times each:

- the two questions alone, as the launcher asks them (gitfacts, posix_spawn):
  where the repository is (``git rev-parse``) and which key git would sign
  with (``git config --get-regexp``);
- the config load (``config_file.load``) in a repository's subdirectory, with
  the question asked at the load (no prestart before it), against the same
  load with git's answer stubbed out (what the load cost before it asked git);
- whole sessions, ``agent-sandbox run -- true``: started in a repository's
  subdirectory (the workdir found by git, its signing settings read) against
  started in a plain directory (git asked, no repository).  In a real run the
  repository question is asked right after the servers are spawned
  (prestart), so its time overlaps their start.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

N = int(os.environ.get("BENCH_N", "15"))


def _git(*args: str, cwd: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _repo(tmp: str) -> tuple[str, str]:
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "src", "lib"))
    _git("init", "-q", cwd=repo)
    _git("config", "user.signingkey", "ABCD1234", cwd=repo)
    plain = os.path.join(tmp, "plain")
    os.mkdir(plain)
    return os.path.join(repo, "src", "lib"), plain


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - start) * 1000


def main() -> int:
    if not shutil.which("git"):
        print("bench/git.py: git is not installed; nothing to measure")
        return 0
    from libbroker.launcher import config, config_file, gitfacts

    tmp = tempfile.mkdtemp(prefix="bench-git-")
    try:
        sub, plain = _repo(tmp)
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        facts = config.HostFacts(home=home, cwd=sub, gh_present=False)
        asked = gitfacts.start_locate
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SANDBOX", "GIT_"))}
        env.update(HOME=home, XDG_STATE_HOME=os.path.join(tmp, "state"))
        cfg = os.path.join(tmp, "config.toml")
        with open(cfg, "w") as fh:
            fh.write('token_command = ""\nrecord = false\n')
        backend = "bwrap" if shutil.which("bwrap") else "nono"
        session = ["agent-sandbox", "run", f"--config={cfg}", f"--sandbox={backend}", "--", "true"]
        times: dict[str, list[float]] = {k: [] for k in (
            "git rev-parse (repository)", "git config (signing key)",
            "config load, no git (before)", "config load, asking git",
            f"session {backend}, plain dir", f"session {backend}, repo subdir")}
        for _ in range(N):
            times["git rev-parse (repository)"].append(
                _timed(lambda: gitfacts.locate(sub, home)))
            times["git config (signing key)"].append(_timed(lambda: gitfacts.collect(
                gitfacts.start_signing(os.path.dirname(os.path.dirname(sub)), home))))
            gitfacts.start_locate = lambda *_: None  # type: ignore[assignment]
            times["config load, no git (before)"].append(
                _timed(lambda: config_file.load(None, facts)))
            gitfacts.start_locate = asked
            times["config load, asking git"].append(_timed(lambda: config_file.load(None, facts)))
            for name, where in ((f"session {backend}, plain dir", plain),
                                (f"session {backend}, repo subdir", sub)):
                times[name].append(_timed(lambda w=where: subprocess.run(  # type: ignore[misc]
                    session, cwd=w, env=env, check=True, capture_output=True, timeout=120)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"git questions: median of {N} runs each (ms)")
    for name, ms in med.items():
        print(f"  {name:<34} {ms:8.1f} ms")
    load = med["config load, asking git"] / med["config load, no git (before)"]
    print(f"  config load asking git / without = {load:.1f}x "
          f"(+{med['config load, asking git'] - med['config load, no git (before)']:.1f} ms, "
          "overlapped with the servers' start in a real run)")
    base, repo = med[f"session {backend}, plain dir"], med[f"session {backend}, repo subdir"]
    print(f"  session in a repo subdir / in a plain dir = {repo / base:.2f}x "
          f"({repo - base:+.1f} ms)")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (2 cores; figures scale with it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
