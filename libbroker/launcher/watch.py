"""``agent-sandbox watch``: follow a live session's record, one line per event.

Which record: the SESSION named, else the newest live one.  Live means no
end event yet and its launcher still running: the start event names the
launcher's pid and the time it wrote it, and a process of that pid that
started later (the pid reused) or is a zombie is not it.  A launcher killed
with SIGKILL writes no end event: watch says so in one line on stderr and
looks further (no SESSION), or stops with status 1 (that SESSION, or the
launcher dies while watched).  It never waits on a record nothing writes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

from libbroker.errors import UsageError
from libbroker.launcher import record
from libbroker.launcher.report import _argv, _num, _seconds, _size, at, printable

SCAN = 50  # records looked at for a live one, newest first
SAID = 3  # lines about dead launchers before "and N more"
_SLACK = 2.0  # seconds between a launcher's start and its record's (clock ticks, rounding)


# --- pure --------------------------------------------------------------------


def watch_line(e: Mapping[str, Any], *, color: bool = False) -> str:
    """One event as ``watch`` shows it; refusals marked (``!!``, and red on a tty)."""
    t = e.get("t")
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "--"
    ev = e.get("ev")
    bad = False
    if ev == "egress":
        verdict = str(e.get("verdict", "?"))
        bad = verdict != "allowed"
        kind = e.get("kind") or ""
        where = at(str(e.get("host", "-")), _num(e.get("port")))
        text = f"{verdict.upper() if bad else verdict} {where} {kind}"
        text = " ".join([text.rstrip(), *(str(e[k]) for k in ("method", "path", "status")
                                          if k in e)])
        if "down" in e:
            text += f" ({_size(_num(e.get('up')))} up, {_size(_num(e.get('down')))} down" \
                    f", {_seconds(e.get('dur'))})"
        if e.get("reason"):
            text += f": {e['reason']}"
        if e.get("learn"):
            text += "  [learn: would be refused]"
    elif ev in ("broker", "sign"):
        bad = "refused" in e or e.get("exit") != 0
        what = _argv(e.get("argv")) if ev == "broker" else f"key {e.get('key')}"
        result = f"refused: {e['refused']}" if "refused" in e else f"exit {e.get('exit')}"
        text = f"{what}: {result} ({_seconds(e.get('dur'))})"
    elif ev == "start":
        text = (f"session {e.get('id')} ({e.get('backend')}"
                f"{', LEARN MODE' if e.get('learn') else ''}): {_argv(e.get('cmd'))}")
    elif ev == "end":
        text = f"exit {e.get('exit')} after {_seconds(e.get('dur'))}"
    else:
        text = json.dumps(dict(e))
    line = printable(f"{stamp} {'!!' if bad else '  '} {ev!s:<6} {text}")
    return f"\x1b[1;31m{line}\x1b[0m" if bad and color else line


# --- the launcher's liveness --------------------------------------------------


def _started_at(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds); None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def launcher_alive(start: Mapping[str, Any]) -> bool:
    """Whether the launcher that wrote ``start`` (a start event) still runs."""
    pid, t = start.get("pid"), start.get("t")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False  # a record that names no launcher: nothing can be waited for
    began = _started_at(pid)
    return began is not None and (not isinstance(t, int | float) or began <= t + _SLACK)


def ends(path: str) -> tuple[dict[str, Any], bool]:
    """A record's start event (empty if unreadable) and whether its last line is the end."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(65536)
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 65536))
            tail = fh.read()
    except OSError:
        return {}, False
    try:
        start = json.loads(first)
        last = json.loads(tail.split(b"\n")[-2]) if tail.endswith(b"\n") else {}
    except (ValueError, IndexError):
        return {}, False
    if not isinstance(start, dict) or not isinstance(last, dict):
        return {}, False
    return (start if start.get("ev") == "start" else {}), last.get("ev") == "end"


def gone_line(sid: str, start: Mapping[str, Any]) -> str:
    return (f"agent-sandbox watch: session {sid} has no end event and its launcher "
            f"(pid {start.get('pid', '?')}) is gone (killed?); "
            f"agent-sandbox report {sid} shows what it recorded")


def newest_live(directory: str, err: TextIO) -> str | None:
    """The newest live record's path, else None; says on ``err`` which were skipped and why."""
    ids = record.listing(directory)
    if not ids:
        err.write(f"agent-sandbox watch: no session records in {directory}\n")
        return None
    dead = 0
    found = None
    for sid in reversed(ids[-SCAN:]):
        path = os.path.join(directory, sid + record.SUFFIX)
        start, ended = ends(path)
        if not start:  # made this instant, its start event not yet whole: look once more
            time.sleep(0.2)
            start, ended = ends(path)
        if ended:
            continue
        if launcher_alive(start):
            found = path
            break
        dead += 1
        if dead <= SAID:
            err.write(gone_line(sid, start) + "\n")
    if dead > SAID:
        err.write(f"agent-sandbox watch: and {dead - SAID} more sessions like it\n")
    if found is None:
        err.write(f"agent-sandbox watch: no live session; the newest is {ids[-1]} "
                  f"(agent-sandbox report {ids[-1]})\n")
    return found


def follow(path: str, *, poll: float = 0.2,
           stop: Callable[[], bool] | None = None) -> Iterator[dict[str, Any]]:
    """Each event of ``path`` as it is appended; ends after the end event (or ``stop()``).

    ``stop()`` is asked when nothing new is there; once it is true, one more
    read takes what was written before the writer went.
    """
    pending = b""
    stopping = False
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(65536)
            if not chunk:
                if stopping:
                    return
                stopping = stop is not None and stop()
                if not stopping:
                    time.sleep(poll)
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    yield obj
                    if obj.get("ev") == "end":
                        return


# --- the entry point -----------------------------------------------------------


def main(args: Mapping[str, Any], out: TextIO | None = None, home: str = "") -> int:
    """``agent-sandbox watch``: 0 after the end event, 1 when the launcher is gone."""
    out = out or sys.stdout
    directory = record.sessions_dir(home)
    which = args.get("SESSION")
    if which:
        try:
            path = record.find(directory, which)
        except record.RecordError as exc:
            raise UsageError(str(exc)) from None
    else:
        found = newest_live(directory, sys.stderr)
        if found is None:
            return 1
        path = found
    start, _ = ends(path)
    color = out.isatty() and not os.environ.get("NO_COLOR")
    out.write(f"watching {path} (Ctrl-C to stop)\n")
    out.flush()
    last: Mapping[str, Any] = {}
    try:
        for last in follow(path, stop=lambda: not launcher_alive(start)):
            out.write(watch_line(last, color=color) + "\n")
            out.flush()
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if last.get("ev") == "end":
        return 0
    sid = os.path.basename(path).removesuffix(record.SUFFIX)
    sys.stderr.write(gone_line(sid, start) + "\n")
    return 1
