"""Run inside a sandbox by test_limits.py: a bounded fork bomb, a memory hog, a /tmp filler.

Standard library only, no site (``python3 -I -S``).  Prints one JSON line.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20


def bomb(most: int) -> dict[str, object]:
    """Fork up to ``most`` children that stay alive together; stops itself at the first refusal."""
    r, w = os.pipe()
    kids, error = [], ""
    for _ in range(most):
        try:
            pid = os.fork()
        except OSError as exc:
            error = errno.errorcode.get(exc.errno or 0, str(exc))
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the parent closes its end
            os._exit(0)
        kids.append(pid)
    os.close(w)
    for pid in kids:
        os.waitpid(pid, 0)
    os.close(r)
    return {"forked": len(kids), "error": error}


HOG = """
import sys
chunks = []
try:
    for _ in range(2048):  # up to 2 GiB, every page touched
        chunks.append(bytearray(1 << 20))
except MemoryError:
    sys.exit(3)
sys.exit(0)
"""


def hog() -> int:
    """The hog's status: -9 killed (cgroup OOM), 3 refused (MemoryError), 0 nothing stopped it."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", HOG], check=False)
    return done.returncode


def fill_tmp(most_mib: int) -> dict[str, object]:
    chunk = b"x" * MiB
    written, error = 0, ""
    try:
        with open("/tmp/fill", "wb", buffering=0) as fh:
            for _ in range(most_mib):
                written += fh.write(chunk)
    except OSError as exc:
        error = errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        if os.path.exists("/tmp/fill"):
            os.unlink("/tmp/fill")
    return {"written": written, "error": error}


def main() -> None:
    out: dict[str, object] = {"bomb": bomb(int(sys.argv[1]))}
    time.sleep(0.05)
    out["hog"] = hog()
    out["tmp"] = fill_tmp(64) if "tmp" in sys.argv[2:] else {}
    if "broker" in sys.argv[2:]:  # the session's broker still serves after the hog
        done = subprocess.run(["broker-client", "-n", "--", "true"], check=False)
        out["broker"] = done.returncode
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
