"""``agent-sandbox report`` and ``watch``: a session record, read by a person or a script.

:func:`summarize` turns a record's events into one dict (what ``--json``
prints); :func:`render` turns that into text a person reads in ten seconds.
Both are pure; so is ``--propose``'s line (:mod:`.propose`) and ``watch``'s
lines (:mod:`.watch`).  The entry points below them read files and print.  Plain text always: the
report is short enough that a table library would not earn its import.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from libbroker.errors import UsageError
from libbroker.launcher import record

LIST_MAX = 20
_DEFAULT_PORTS = (80, 443)


# --- pure --------------------------------------------------------------------


def _where(host: str, port: int) -> str:
    """``host`` as a domains entry names it: without a port when it is 80 or 443."""
    return host if port in _DEFAULT_PORTS else f"{host}:{port}"


def at(host: str, port: int) -> str:
    """``host:port`` always: a host reached on 80 and on 443 is two rows that say which."""
    return f"{host}:{port}"


def printable(text: str) -> str:
    """``text`` with each unprintable character but the newline escaped (``\\xNN``).

    Hosts, reasons and argv in a record come from inside the sandbox: none
    may move the cursor or recolour the terminal of the person reading it.
    """
    return "".join(c if c == "\n" or c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # not reached


def _seconds(value: object) -> str:
    return f"{value:.2f} s" if isinstance(value, int | float) else "-"


def _num(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _suggestion(host: str, port: int, reason: str) -> str:
    """What to add to the config if this refusal was wrong."""
    if "not on the allow list" in reason:
        return f'if it was needed: add "{_where(host, port)}" to domains in config.toml'
    if "plain HTTP" in reason:
        return "use https (the token's hosts are never reached over plain HTTP)"
    if "is refused:" in reason or "blocked-address" in reason:
        return ("an address rule: only for a lab host you trust, pin it "
                f'(resolve = ["{host}:IP"]) or open its range (allow_cidr)')
    return ""


def summarize(events: list[dict[str, Any]], problems: list[str] | None = None) -> dict[str, Any]:
    """Everything the report says, as data (``--json``)."""
    start = next((e for e in events if e.get("ev") == "start"), {})
    end = next((e for e in events if e.get("ev") == "end"), {})
    hosts: dict[tuple[str, int], dict[str, Any]] = {}
    refusals: list[dict[str, Any]] = []
    commands: list[dict[str, Any]] = []
    signatures: list[dict[str, Any]] = []
    learned: set[str] = set()
    for e in events:
        ev = e.get("ev")
        if ev == "egress":
            host, port = str(e.get("host", "-")), _num(e.get("port"))
            row = hosts.setdefault((host, port), {
                "host": host, "port": port, "requests": 0, "up": 0, "down": 0,
                "refused": 0, "failed": 0})
            verdict = e.get("verdict")
            if verdict == "allowed":
                row["requests"] += 1
                row["up"] += _num(e.get("up"))
                row["down"] += _num(e.get("down"))
            elif verdict == "refused":
                row["refused"] += 1
                reason = str(e.get("reason", ""))
                refusals.append({"host": host, "port": port, "reason": reason,
                                 "fix": _suggestion(host, port, reason)})
            else:
                row["failed"] += 1
            if e.get("learn"):
                learned.add(_where(host, port))
        elif ev == "broker":
            commands.append({"argv": e.get("argv") or [], "exit": e.get("exit"),
                             "refused": e.get("refused"), "dur": e.get("dur")})
        elif ev == "sign":
            ok = e.get("exit") == 0 and "refused" not in e
            signatures.append({"key": e.get("key"), "ok": ok,
                               "exit": e.get("exit"), "refused": e.get("refused")})
    failures = [c for c in commands if c["refused"] is not None or c["exit"] != 0]
    timed = [c for c in commands if isinstance(c["dur"], int | float)]
    slowest = max(timed, key=lambda c: c["dur"]) if timed else None
    return {
        "id": start.get("id"),
        "backend": start.get("backend"),
        "workdir": start.get("workdir"),
        "cmd": start.get("cmd"),
        "learn": bool(start.get("learn")),
        "config": start.get("config"),
        "exit": end.get("exit"),
        "duration": end.get("dur"),
        "ended": bool(end),
        "hosts": sorted(hosts.values(), key=lambda r: (-r["requests"] - r["refused"],
                                                       r["host"], r["port"])),
        "refusals": refusals,
        "commands": {"count": len(commands), "failures": failures, "slowest": slowest},
        "signatures": signatures,
        "would_refuse": sorted(learned),
        "verified": problems is not None and not problems,
        "problems": problems or [],
    }


def _argv(argv: object) -> str:
    words = [str(w) for w in argv] if isinstance(argv, list) else []
    text = " ".join(w if w and all(c.isalnum() or c in "-_./=:@%+," for c in w)
                    else json.dumps(w) for w in words)
    return text if len(text) <= 70 else text[:67] + "..."


def _hosts_table(hosts: list[dict[str, Any]]) -> list[str]:
    """One line per host and port: requests, bytes each way, refusals."""
    if not hosts:
        return ["  no network requests"]
    width = max(len("host"), *(len(h["host"]) for h in hosts))
    out = ["", f"  {'host':<{width}}   port  requests  {'up':>9}  {'down':>9}  refused"]
    for h in hosts:
        fail = f"  ({h['failed']} failed)" if h["failed"] else ""
        out.append(f"  {h['host']:<{width}}  {h['port']:>5}  {h['requests']:>8}  "
                   f"{_size(h['up']):>9}  {_size(h['down']):>9}  {h['refused']:>7}{fail}")
    return out


def _refusals(refusals: list[dict[str, Any]]) -> list[str]:
    """Each distinct refusal once, with its fix."""
    if not refusals:
        return []
    out = ["", f"refused ({len(refusals)}):"]
    seen: set[tuple[str, int, str]] = set()
    for r in refusals:
        key = (r["host"], r["port"], r["reason"])
        if key in seen:
            continue
        seen.add(key)
        out.append(f"  {at(r['host'], r['port'])}: {r['reason']}")
        if r["fix"]:
            out.append(f"    -> {r['fix']}")
    return out


def render(s: Mapping[str, Any]) -> str:
    """The report as plain text."""
    out: list[str] = []
    status = "still running (or its launcher was killed)" if not s["ended"] \
        else f"exit {s['exit']}"
    learn = "  LEARN MODE" if s["learn"] else ""
    out.append(f"session {s['id']}: {status}, {_seconds(s['duration'])}, "
               f"{s['backend']}{learn}")
    out.append(f"  {_argv(s['cmd'])}   in {s['workdir']}")
    out += _hosts_table(s["hosts"])
    out += _refusals(s["refusals"])
    if s["learn"]:
        out.append("")
        if s["would_refuse"]:
            out.append("learn mode: the allow list would have refused "
                       + ", ".join(s["would_refuse"]))
        out.append("  agent-sandbox report --propose prints the domains line")
    c = s["commands"]
    out.append("")
    if c["count"]:
        slow = c["slowest"]
        out.append(f"brokered commands: {c['count']}, {len(c['failures'])} failed"
                   + (f"; slowest {_seconds(slow['dur'])}: {_argv(slow['argv'])}" if slow else ""))
        for f in c["failures"]:
            why = f"refused: {f['refused']}" if f["refused"] is not None else f"exit {f['exit']}"
            out.append(f"  failed ({why}): {_argv(f['argv'])}")
    else:
        out.append("brokered commands: none")
    sigs = s["signatures"]
    if sigs:
        bad = [g for g in sigs if not g["ok"]]
        keys = sorted({str(g["key"]) for g in sigs})
        out.append(f"signatures: {len(sigs)} ({len(sigs) - len(bad)} made, {len(bad)} failed) "
                   f"with {', '.join(keys)}")
    else:
        out.append("signatures: none")
    if s["problems"]:
        out.append("")
        out.append("record: DOES NOT VERIFY (agent-sandbox report --verify)")
    elif s["verified"]:
        out.append("record: chain intact")
    return "\n".join(out) + "\n"


# --- entry points --------------------------------------------------------------


def _open(which: str | None, last: bool, home: str) -> str:
    try:
        return record.find(record.sessions_dir(home), which, last=last)
    except record.RecordError as exc:
        raise UsageError(str(exc)) from None


def main(args: Mapping[str, Any], out: TextIO | None = None, home: str = "") -> int:
    """``agent-sandbox report``; its exit status."""
    out = out or sys.stdout
    directory = record.sessions_dir(home)
    if args.get("--list"):
        return _list(directory, out, as_json=bool(args.get("--json")))
    path = _open(args.get("SESSION"), bool(args.get("--last")), home)
    if args.get("--verify"):
        problems = record.verify(path)
        for p in problems:
            out.write(f"{os.path.basename(path)}: {p}\n")
        if not problems:
            out.write(f"{os.path.basename(path)}: chain intact, "
                      f"{len(record.read_lines(path))} lines\n")
        return 1 if problems else 0
    try:
        events = record.events(path)
    except record.RecordError as exc:
        raise UsageError(str(exc)) from None
    if args.get("--propose"):
        return _propose(events, out)
    summary = summarize(events, record.verify(path))
    if args.get("--json"):
        out.write(json.dumps(summary, indent=2) + "\n")
    else:
        out.write(printable(render(summary)))
    return 0


def _propose(events: list[dict[str, Any]], out: TextIO) -> int:
    from libbroker.launcher.propose import propose

    start = next((e for e in events if e.get("ev") == "start"), {})
    configured = start.get("domains")
    if not isinstance(configured, list):
        sys.stderr.write("agent-sandbox: this record does not name the session's domains "
                         "(an older launcher wrote it): add yours to the line below\n")
        configured = []
    out.write(propose(events, configured, start.get("inject") or ()) + "\n")
    return 0


def _list(directory: str, out: TextIO, *, as_json: bool) -> int:
    try:
        ids = record.listing(directory)[-LIST_MAX:][::-1]
    except record.RecordError as exc:
        raise UsageError(str(exc)) from None
    rows = []
    for sid in ids:
        events = record.events(os.path.join(directory, sid + record.SUFFIX))
        s = summarize(events)
        rows.append({"id": sid, "backend": s["backend"], "exit": s["exit"],
                     "duration": s["duration"], "ended": s["ended"], "cmd": s["cmd"],
                     "requests": sum(h["requests"] for h in s["hosts"]),
                     "refused": len(s["refusals"]), "commands": s["commands"]["count"]})
    if as_json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not rows:
        out.write(f"no session records in {directory}\n")
        return 0
    for r in rows:
        status = f"exit {r['exit']}" if r["ended"] else "running?"
        out.write(f"{r['id']}  {r['backend'] or '-':<5}  {status:<8}  "
                  f"{_seconds(r['duration']):>9}  {r['requests']:>4} req  "
                  f"{r['refused']:>3} refused  {_argv(r['cmd'])}\n")
    return 0
