"""Benchmark: `git commit -S` through gpg-shim and the broker vs plain gpg.

Everything is real and on this machine: a throwaway ed25519 key (no
passphrase) in a temporary GNUPGHOME, a broker-server with --sign-key, and
one repository per variant.  Each round makes one empty signed commit in every
variant, interleaved so that load from elsewhere hits all of them alike.

Variants:
  gpg            gpg.program=gpg with the secret key (the baseline)
  shim           gpg.program=gpg-shim (the console script as installed)
  shim -I -S     gpg.program=libbroker.signing.shim.program_script: a `#!python -IS`
                 script (no site, no .pth files, no shell in between)
  shim native    gpg.program=the C fast path (libbroker/native, built by
                 `just setup`), laid out as the launcher does: the Python
                 script beside it in python/ for everything but signing.
                 This is what a session's git runs when it is built.
  unsigned       the same commit without a signature (what git alone costs)

Prints median wall times, ratios against the baseline (target: the session's
gpg.program <= 1.5x), the
floor any Python gpg.program meets (the gpg commit plus one bare
`python -I -S -c pass`), and the start-up cost of the shim alone
(`gpg-shim --version`) for each way of starting it.  BENCH_RUNS sets the
rounds (default 30).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", "30"))
WARMUP = 3
ROOT = Path(__file__).resolve().parent.parent


def installed(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which(name)
    if found is None:
        sys.exit(f"bench/sign.py: {name} is not installed (pip install -e .)")
    return found


def run(argv: list[str], env: dict[str, str] | None = None, data: bytes | None = None) -> bytes:
    done = subprocess.run(argv, env=env, input=data, capture_output=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench/sign.py: {' '.join(argv)} failed: {done.stderr.decode().strip()}")
    return done.stdout


def make_keys(root: Path) -> tuple[Path, Path, str]:
    secret, public = root / "s", root / "p"
    secret.mkdir(mode=0o700)
    public.mkdir(mode=0o700)
    gpg = ["gpg", "--batch"]
    run([*gpg, "--homedir", str(secret), "--passphrase", "", "--quick-gen-key",
         "Bench <bench@example.test>", "ed25519", "sign", "never"])
    listing = run([*gpg, "--homedir", str(secret), "--with-colons", "--list-secret-keys"])
    fingerprint = re.findall(r"^fpr:+([0-9A-F]{40}):", listing.decode(), re.M)[0]
    exported = run([*gpg, "--homedir", str(secret), "--export", fingerprint])
    run([*gpg, "--homedir", str(public), "--import"], data=exported)
    return secret, public, fingerprint


def make_repo(path: Path, env: dict[str, str], program: str, key: str, sign: bool) -> None:
    run(["git", "init", "-q", str(path)], env)
    for name, value in [("user.name", "Bench"), ("user.email", "bench@example.test"),
                        ("user.signingkey", key), ("gpg.program", program),
                        ("commit.gpgsign", "true" if sign else "false")]:
        run(["git", "-C", str(path), "config", name, value], env)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def startup_ms(argv: list[str], env: dict[str, str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return median_ms(times)


SHOWN_IMPORTS = ("bin.gpg_shim", "libbroker.cli", "libbroker.errors", "libbroker.signing.args",
                 "libbroker.signing.shim", "libbroker.broker.dial", "_socket", "select", "_json",
                 # none of these should appear: they were the cost before
                 "typing", "socket", "json", "enum", "os", "libbroker.wire")


def sign_path_imports() -> list[tuple[str, int]]:
    """Cumulative import time (us) of the modules gpg-shim loads to sign, best of 5."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import bin.gpg_shim, "
            "libbroker.signing.shim")
    best: dict[str, int] = {}
    for _ in range(5):
        done = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", code],
                              capture_output=True, text=True, check=False)
        for line in done.stderr.splitlines():
            if "|" not in line or "self [us]" in line:
                continue
            _, cumulative, name = line[len("import time:"):].split("|")
            if name.strip() in SHOWN_IMPORTS:
                best[name.strip()] = min(best.get(name.strip(), 1 << 62), int(cumulative))
    return [(name, best[name]) for name in SHOWN_IMPORTS if name in best]


def main() -> None:
    for tool in ("git", "gpg", "gpgconf"):
        if shutil.which(tool) is None:
            sys.exit(f"bench/sign.py: {tool} is not installed")
    shim = installed("gpg-shim")
    broker_server = installed("broker-server")
    root = Path(tempfile.mkdtemp(prefix="bs-", dir="/tmp"))
    broker = None
    secret = public = None
    try:
        secret, public, key = make_keys(root)
        work = root / "w"
        work.mkdir()
        sock = root / "b.sock"
        broker = subprocess.Popen(
            [broker_server, f"--socket={sock}", f"--workdir={work}", f"--sign-key={key}"],
            env=dict(os.environ, GNUPGHOME=str(secret)), stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        assert broker.stdout is not None
        if not broker.stdout.readline().startswith(b"listening unix:"):
            sys.exit("bench/sign.py: broker-server did not start")

        sys.path.insert(0, str(ROOT))
        from libbroker.native import build, built, install_gpg_program, program_script

        fast = root / "gpg-shim-fast"
        fast.write_text(program_script(sys.executable, str(ROOT)))
        fast.chmod(0o755)
        native = built("gpg-shim") or build("gpg-shim", str(root / "gpg-shim-built"))
        (root / "gp").mkdir()
        session_program = root / "gp" / "gpg-shim"
        install_gpg_program(str(session_program), sys.executable, str(ROOT), native)

        base = {"PATH": os.environ["PATH"], "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
                "LANG": "C"}
        host_env = dict(base, GNUPGHOME=str(secret))
        sandbox_env = dict(base, GNUPGHOME=str(public), AGENT_SANDBOX_BROKER_SOCKET=str(sock))
        variants = {
            "gpg": (host_env, shutil.which("gpg") or "gpg", True),
            "shim": (sandbox_env, shim, True),
            "shim -I -S": (sandbox_env, str(fast), True),
            "shim native": (sandbox_env, str(session_program), True),
            "unsigned": (host_env, "gpg", False),
        }
        repos = {}
        for i, (name, (env, program, sign)) in enumerate(variants.items()):
            repos[name] = work / f"r{i}"
            make_repo(repos[name], env, program, key, sign)

        samples: dict[str, list[float]] = {name: [] for name in variants}
        for round_no in range(WARMUP + RUNS):
            for name, (env, _, _) in variants.items():
                argv = ["git", "-C", str(repos[name]), "commit", "-q", "--allow-empty",
                        "-m", f"round {round_no}"]
                start = time.perf_counter()
                run(argv, env)
                if round_no >= WARMUP:
                    samples[name].append(time.perf_counter() - start)
        for name in ("gpg", "shim", "shim -I -S", "shim native"):  # every commit is signed
            shown = run(["git", "-C", str(repos[name]), "log", "-1", "--format=%G?"],
                        host_env).decode().strip()
            if shown not in ("G", "U"):
                sys.exit(f"bench/sign.py: {name}'s commit is not signed ({shown!r})")

        bare = startup_ms([sys.executable, "-I", "-S", "-c", "pass"], sandbox_env)
        baseline = median_ms(samples["gpg"])
        print(f"git commit -S, median of {RUNS} rounds (interleaved), this machine:")
        print(f"  {'variant':<12} {'median':>9} {'vs gpg':>8}")
        for name in variants:
            ms = median_ms(samples[name])
            print(f"  {name:<12} {ms:7.1f} ms {ms / baseline:7.2f}x")
        floor = baseline + bare
        print(f"  {'floor':<12} {floor:7.1f} ms {floor / baseline:7.2f}x  "
              "(a Python gpg.program: gpg's commit + one bare `python -I -S -c pass`)")
        ratio = median_ms(samples["shim native"]) / baseline
        verdict = "ok" if ratio <= 1.5 else "OVER TARGET"
        print(f"  target: the session's gpg.program (shim native) <= 1.50x gpg: {ratio:.2f}x, "
              f"{verdict}")
        print("start-up of the shim alone (gpg-shim --version):")
        print(f"  console script  {startup_ms([shim, '--version'], sandbox_env):7.1f} ms")
        print(f"  python -I -S    {startup_ms([str(fast), '--version'], sandbox_env):7.1f} ms")
        print(f"  native (hands --version to python -I -S) "
              f"{startup_ms([str(session_program), '--version'], sandbox_env):7.1f} ms")
        print(f"  (python -I -S -c pass: {bare:.1f} ms; gpg --version: "
              f"{startup_ms(['gpg', '--version'], sandbox_env):.1f} ms)")
        print("imports of the signing path under python -I -S (best of 5, cumulative):")
        loaded = dict(sign_path_imports())
        for name in SHOWN_IMPORTS:
            shown = f"{loaded[name] / 1000:6.1f} ms" if name in loaded else "  not imported"
            print(f"  {shown}  {name}")
    finally:
        if broker is not None:
            broker.terminate()
            try:
                broker.wait(15)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()
        for home in (secret, public):
            if home is not None:
                subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"],
                               capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
