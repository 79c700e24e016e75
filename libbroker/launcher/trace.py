"""``AGENT_SANDBOX_TRACE=1``: when each phase of a session ended, on stderr.

Times are in ms since the launcher process started (so the interpreter's own
start shows), with the launcher's CPU time beside them.
"""

from __future__ import annotations

import os
import time

ENABLED = bool(os.environ.get("AGENT_SANDBOX_TRACE"))


def _process_start() -> float:
    """This process's start on the monotonic clock (to trace the interpreter's own start)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age


_T0 = _process_start() if ENABLED else 0.0


def restart() -> None:
    """In a run forked warm (:mod:`.launcher_zygote`): its own environment, its own start."""
    global ENABLED, _T0
    ENABLED = bool(os.environ.get("AGENT_SANDBOX_TRACE"))
    _T0 = _process_start() if ENABLED else 0.0
    _MARKS.clear()


def trace(what: str) -> None:
    """With AGENT_SANDBOX_TRACE set: ``what`` just ended, in ms since start."""
    if ENABLED:
        ms = (time.monotonic() - _T0) * 1000
        cpu = time.process_time() * 1000
        os.write(2, f"agent-sandbox: trace {ms:7.1f} ms (cpu {cpu:5.1f} ms) {what}\n".encode())


def children(pids: dict[str, int]) -> None:
    """With AGENT_SANDBOX_TRACE set: the CPU time each child has used so far."""
    if ENABLED:
        tick = os.sysconf("SC_CLK_TCK")
        parts = []
        for name, pid in pids.items():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                # utime, stime, cutime, cstime: its own and its reaped children's.
                ms = sum(int(f) for f in fields[11:15]) * 1000 / tick
                parts.append(f"{name} {ms:.0f} ms")
            except (OSError, ValueError, IndexError):
                parts.append(f"{name} -")
        trace("children's cpu: " + ", ".join(parts))


_MARKS: dict[str, float] = {}


def mark(name: str) -> None:
    """With AGENT_SANDBOX_TRACE set: remember when ``name`` (go, ended) happened."""
    if ENABLED:
        _MARKS[name] = time.monotonic()


def split(command: str) -> None:
    """With AGENT_SANDBOX_TRACE set: one line, where the session's time went and what dominated.

    The start (before go), ``command``'s own run (its start included: Gemini
    CLI's node start is most of its ``--version``), the end (write-back, sweep).
    """
    if not ENABLED or "go" not in _MARKS or "ended" not in _MARKS:
        return
    now = time.monotonic()
    start = (_MARKS["go"] - _T0) * 1000
    run = (_MARKS["ended"] - _MARKS["go"]) * 1000
    end = (now - _MARKS["ended"]) * 1000
    ours = start + end
    what = (f"{command}'s own run dominates ({run / (run + ours):.0%})" if run > ours
            else f"the session's own start and end dominate ({ours / (run + ours):.0%})")
    trace(f"where the time went: start {start:.0f} ms, {command} {run:.0f} ms, "
          f"end {end:.0f} ms: {what}")
