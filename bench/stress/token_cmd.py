"""A token command whose behaviour the suite steers through a state file.

    python3 token_cmd.py STATE

STATE holds one word: ``ok:TOKEN`` prints TOKEN; ``fail`` exits 1; ``hang``
sleeps (the proxy must time it out); ``hang-child MARKER`` waits on a child
``sleep`` carrying MARKER in its argv (a grandchild of the proxy, which the
proxy must not leave behind).  Each run appends a line to STATE.runs.
"""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> int:
    state = sys.argv[1]
    with open(state) as fh:
        word = fh.read().strip()
    with open(state + ".runs", "a") as fh:
        fh.write(f"{time.time():.3f} {word.split(':')[0]}\n")
    if word.startswith("ok:"):
        print(word[3:])
        return 0
    if word == "hang":
        time.sleep(3600)
    if word.startswith("hang-child"):
        marker = word.split()[1]
        subprocess.run(["sleep", f"3600.{marker}"], check=False)
    return 1


if __name__ == "__main__":
    sys.exit(main())
