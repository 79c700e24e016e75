"""What a sandbox's cgroups say was hit, one line per limit (I/O: the group's files, /dev/kmsg).

Read once, at the end of a session or a brokered command, for the line that
tells the person why their process stopped (:func:`report`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from libbroker.sandbox.cgroups import read_text
from libbroker.sandbox.limits import size_text

if TYPE_CHECKING:
    from libbroker.sandbox.cgroups import Group


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key and words[1].isdigit():
            return int(words[1])
    return 0


def _oom_victims(name: str) -> list[str]:
    """``pid N (comm)`` of each process the kernel's OOM killer took in group ``name``.

    From the kernel log (/dev/kmsg), which names the group; empty when it
    cannot be read (an ordinary user, dmesg_restrict).
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    found = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not record:
                break
            text = record.split(";", 1)[-1]
            if "oom-kill:" in text and f"/{name}," in text.replace("oom_memcg=", "/"):
                fields = dict(part.split("=", 1) for part in text.strip().split(",") if "=" in part)
                if "pid" in fields:
                    found.append(f"pid {fields['pid']} ({fields.get('task', '?')})")
    finally:
        os.close(fd)
    return found


def report(group: Group) -> list[str]:
    """Each limit that was hit, as ``memory limit (8 GiB): pid 1234 (node) was killed``."""
    out: list[str] = []
    limits = group.limits
    for directory in group.dirs:
        name = os.path.basename(directory)
        if group.kind == "cgroup2":
            memory = read_text(os.path.join(directory, "memory.events"))
            kills, refused = _counter(memory, "oom_kill"), _counter(memory, "max")
        else:
            oom = read_text(os.path.join(directory, "memory.oom_control"))
            kills = _counter(oom, "oom_kill")
            refused = int(read_text(os.path.join(directory, "memory.failcnt")).strip() or 0)
        if kills and limits.memory:
            victims = _oom_victims(name)
            what = f"{', '.join(victims)} {'was' if len(victims) == 1 else 'were'} killed"
            if not victims:
                what = f"{kills} process{'es were' if kills > 1 else ' was'} killed"
            out.append(f"memory limit ({size_text(limits.memory)}): {what}")
        elif refused and limits.memory and os.path.exists(os.path.join(directory, "memory.max")):
            pass  # reclaim at the limit, nobody killed: not worth a line
        forks = _counter(read_text(os.path.join(directory, "pids.events")), "max")
        if forks and limits.tasks:
            plural = "s were" if forks > 1 else " was"
            out.append(f"task limit ({limits.tasks}): {forks} fork{plural} refused")
    return out
