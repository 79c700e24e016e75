"""Benchmark: the whole-process cost of one policy-hook call.

The hook runs on every file-tool call, so what matters is a fresh process end
to end.  Prints the median wall time of one call (an allowed Read, a denied
Read, a Grep) next to ``python -c pass`` measured in the same run with the
same interpreter, the ratios (target: <= 2x), and the import-time breakdown
of the modules the hook imports beyond a bare interpreter.  Two forms: the
``policy-hook`` console script, and the command ``render`` puts into the
managed settings (``python -I -S``, no site-packages), run through ``sh -c``
as Claude Code runs it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = int(os.environ.get("BENCH_RUNS", "40"))
# An installed package has its bytecode compiled; let the warm-up runs write it
# even where the environment says not to, so neither side pays for compiling.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def hook_script() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "policy-hook")
    if not os.access(beside, os.X_OK):
        sys.exit("bench/hook.py: no policy-hook beside this python (pip install -e .)")
    return beside


def event(tool: str, tool_input: dict[str, object], cwd: str) -> bytes:
    return json.dumps({
        "session_id": "bench", "transcript_path": "/tmp/bench.jsonl", "cwd": cwd,
        "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": tool,
        "tool_input": tool_input, "tool_use_id": "toolu_bench",
    }).encode()


def wall(argv: list[str], stdin: bytes) -> float:
    start = time.perf_counter()
    subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=ENV, check=False)
    return time.perf_counter() - start


def interleaved_medians(commands: dict[str, tuple[list[str], bytes]],
                        runs: int = RUNS) -> dict[str, float]:
    """Median wall of each command, run in turns so machine load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (argv, stdin) in commands.items():
            times[name].append(wall(argv, stdin))
    return {name: statistics.median(values) for name, values in times.items()}


def import_times(argv: list[str], stdin: bytes) -> dict[str, tuple[int, int]]:
    """module -> (self us, cumulative us) from ``-X importtime``."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], input=stdin,
                          capture_output=True, env=ENV, check=False)
    out: dict[str, tuple[int, int]] = {}
    for line in done.stderr.decode().splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, cumulative, name = line[len("import time:"):].split("|")
        out[name.strip()] = (int(self_us), int(cumulative))
    return out


def main() -> None:
    script = hook_script()
    with tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        proj = os.path.join(home, "proj")
        os.makedirs(os.path.join(home, ".ssh"))
        os.makedirs(os.path.join(proj, "src"))
        policy = {"home": home, "runtime": os.path.join(tmp, "run"), "read": [],
                  "write": [proj], "deny": [], "harness": os.path.join(home, ".claude"),
                  "tool_write": [], "domains": ["github.com"], "proxy_port": 3128}
        policy_path = os.path.join(tmp, "policy.json")
        with open(policy_path, "w") as fh:
            json.dump(policy, fh)
        hook = [script, f"--policy={policy_path}"]
        cases = {
            "allowed Read": event("Read", {"file_path": "src/main.py"}, proj),
            "denied Read": event("Read", {"file_path": "../.ssh/id_rsa"}, proj),
            "Grep in workdir": event("Grep", {"pattern": "x", "path": "src"}, proj),
        }
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from libpolicy.model import Policy
        from libpolicy.render import session_settings

        rendered = session_settings(Policy.load(policy_path), policy_path)
        fast = ["sh", "-c", rendered["hooks"]["PreToolUse"][0]["hooks"][0]["command"]]
        commands = {"python -c pass": ([sys.executable, "-c", "pass"], b"")}
        commands.update({f"console script: {name}": (hook, stdin)
                         for name, stdin in cases.items()})
        commands.update({f"rendered (-I -S): {name}": (fast, stdin)
                         for name, stdin in cases.items()})
        interleaved_medians(commands, 2)  # warm the page cache and write the bytecode
        medians = interleaved_medians(commands)
        baseline = medians["python -c pass"]
        print(f"python: {sys.executable} ({RUNS} runs each, interleaved, median wall)")
        for name, value in medians.items():
            print(f"{name:<36}{value * 1000:8.1f} ms   {value / baseline:.2f}x"
                  f"   ({(value - baseline) * 1000:+.1f} ms)")

        bare = import_times(["-c", "pass"], b"")
        hooked = import_times(hook, cases["denied Read"])
        extra = {k: v for k, v in hooked.items() if k not in bare}
        print("\nimports beyond a bare interpreter (-X importtime, one denied Read):")
        print(f"{'module':<32}{'self us':>10}{'cumul us':>10}")
        for name, (self_us, cumulative) in sorted(extra.items(), key=lambda kv: -kv[1][0]):
            print(f"{name:<32}{self_us:>10}{cumulative:>10}")
        total = sum(v[0] for v in extra.values())
        print(f"{'total self':<32}{total:>10}")
        heavy = [m for m in extra if m.split(".")[0] in
                 ("docopt", "cryptography", "psutil", "nono_py", "yaml", "typing", "dataclasses")]
        print("heavy modules on the hook path:", ", ".join(heavy) or "none")


if __name__ == "__main__":
    main()
