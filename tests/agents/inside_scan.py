"""A scan a session runs inside (by the agent's shell tool) for secret values.

``SCAN.format(parts=...)``: the values come split in two halves joined only in
memory, so the scan's own file and command line do not hold them.  It reads
every process's environment and command line it may (/proc), and every regular
file under the session's HOME, the agents' config copies, the workdir and
/tmp (first 4 MiB of each), and prints ``FOUND <where>`` per hit, then
``SCANNED <files> <procs>``.  Code put before it may set ``EXTRA_PARTS``
(values learnt at run time, split the same way).
"""

from __future__ import annotations

SCAN = r"""
import os
SECRETS = [a + b for a, b in {parts!r} + globals().get("EXTRA_PARTS", [])]
def hit(data):
    return any(s.encode() in data for s in SECRETS)
procs = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == str(os.getpid()):
        continue
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{{pid}}/{{part}}", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        procs += 1
        if hit(data):
            print("FOUND", f"/proc/{{pid}}/{{part}}")
roots = {{os.environ.get(v, "") for v in ("HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME",
                                        "GEMINI_CLI_HOME", "TMPDIR")}} | {{os.getcwd(), "/tmp"}}
files = 0
for root in sorted(r for r in roots if r):
    for dirpath, dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as fh:
                    data = fh.read(4 << 20)
            except OSError:
                continue
            files += 1
            if hit(data):
                print("FOUND", path)
print("SCANNED", files, procs)
"""


def split(*values: str) -> list[tuple[str, str]]:
    """Each value as two halves (the scan joins them)."""
    return [(v[: len(v) // 2], v[len(v) // 2:]) for v in values]


def report(row: str, out: str) -> None:
    """One line for the note's table (``pytest -s | grep TABLE``): what the scan read
    and how many secrets it found (the tests assert 0)."""
    import re

    scanned = re.findall(r"SCANNED \d+ \d+", out)
    found = len(re.findall(r"FOUND ", out))
    print(f"TABLE {row} {scanned[-1] if scanned else 'SCANNED - -'} found={found}")
