"""reaper.kill_below(root, keep): everything below dies but the kept (the launcher's janitor).

Under Landlock the launcher is a child subreaper and kills what the command
left behind at its teardown; its janitor, a child too, must survive that:
the merge of the git configs and the host-run sweep come after, and the
janitor finishes them should the launcher be killed then.  Run in a fresh
process (kill_below reaps every child of its caller).
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, subprocess, sys, time
from libbroker.sandbox import reaper
reaper.become_subreaper()
kept = subprocess.Popen(["sleep", "60"])
# a child with a grandchild, and an orphan (its parent gone: reparented to us)
tree = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"])
orphan_parent = subprocess.Popen(["sh", "-c", "setsid sleep 60 & echo $!"], stdout=subprocess.PIPE)
orphan = int(orphan_parent.stdout.readline())
orphan_parent.wait()
time.sleep(0.2)
reaper.kill_below(os.getpid(), frozenset({kept.pid}))
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
print("kept", alive(kept.pid), "tree", alive(tree.pid), "orphan", alive(orphan))
reaper.kill_below(os.getpid(), frozenset({kept.pid}))  # the kept one alone: no scan
print("again", alive(kept.pid))
kept.kill(); kept.wait()
reaper.kill_below(os.getpid())
print("after", alive(kept.pid))
"""


def test_kill_below_spares_the_kept_and_ends_the_rest() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "kept True tree False orphan False", "again True", "after False"]
