"""``agent-sandbox report`` and ``watch``: a session record, read by a person or a script.

:func:`summarize` turns a record's events into one dict (what ``--json``
prints); :func:`render` turns that into text a person reads in ten seconds;
:func:`propose` is learn mode's ``domains = [...]`` line.  All three are pure.
The entry points below them read files and print.  Plain text always: the
report is short enough that a table library would not earn its import.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from libbroker.errors import UsageError
from libbroker.launcher import record

LIST_MAX = 20
_DEFAULT_PORTS = (80, 443)


# --- pure --------------------------------------------------------------------


def _where(host: str, port: int) -> str:
    return host if port in _DEFAULT_PORTS else f"{host}:{port}"


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


def render(s: Mapping[str, Any]) -> str:
    """The report as plain text."""
    out: list[str] = []
    status = "still running (or its launcher was killed)" if not s["ended"] \
        else f"exit {s['exit']}"
    learn = "  LEARN MODE" if s["learn"] else ""
    out.append(f"session {s['id']}: {status}, {_seconds(s['duration'])}, "
               f"{s['backend']}{learn}")
    out.append(f"  {_argv(s['cmd'])}   in {s['workdir']}")
    hosts = s["hosts"]
    if hosts:
        width = max(len("host"), *(len(_where(h["host"], h["port"])) for h in hosts))
        out.append("")
        out.append(f"  {'host':<{width}}  requests  {'up':>9}  {'down':>9}  refused")
        for h in hosts:
            fail = f"  ({h['failed']} failed)" if h["failed"] else ""
            out.append(f"  {_where(h['host'], h['port']):<{width}}  {h['requests']:>8}  "
                       f"{_size(h['up']):>9}  {_size(h['down']):>9}  {h['refused']:>7}{fail}")
    else:
        out.append("  no network requests")
    if s["refusals"]:
        out.append("")
        out.append(f"refused ({len(s['refusals'])}):")
        seen: set[tuple[str, int, str]] = set()
        for r in s["refusals"]:
            key = (r["host"], r["port"], r["reason"])
            if key in seen:
                continue
            seen.add(key)
            out.append(f"  {_where(r['host'], r['port'])}: {r['reason']}")
            if r["fix"]:
                out.append(f"    -> {r['fix']}")
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


def propose(events: Iterable[Mapping[str, Any]], inject: Iterable[str] = ()) -> str:
    """Learn mode's config line: every host asked for, ``*.`` only for 3+ siblings.

    Hosts the token's hosts (``inject``) are left out: they are allowed
    anyway.  A port other than 80 and 443 stays on its own entry.
    """
    skip = set(inject)
    names: set[str] = set()
    ported: set[str] = set()
    for e in events:
        if e.get("ev") != "egress":
            continue
        host, port = str(e.get("host", "-")), _num(e.get("port"))
        if host in ("-", "") or host in skip:
            continue
        if port in _DEFAULT_PORTS:
            names.add(host)
        else:
            ported.add(f"{host}:{port}")
    by_parent: dict[str, set[str]] = {}
    for name in names:
        _, dot, parent = name.partition(".")
        is_address = name.replace(".", "").isdigit() or name.startswith("[")
        if dot and "." in parent and not is_address:
            by_parent.setdefault(parent, set()).add(name)
    entries = set(names)
    for parent, children in by_parent.items():
        if len(children) >= 3:
            entries -= children
            entries.add("*." + parent)
    entries |= ported
    ordered = sorted(entries, key=lambda n: (n.removeprefix("*.").split(".")[::-1], n))
    return "domains = [" + ", ".join(json.dumps(n) for n in ordered) + "]"


def watch_line(e: Mapping[str, Any], *, color: bool = False) -> str:
    """One event as ``watch`` shows it; refusals marked (``!!``, and red on a tty)."""
    import time

    t = e.get("t")
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "--"
    ev = e.get("ev")
    bad = False
    if ev == "egress":
        verdict = str(e.get("verdict", "?"))
        bad = verdict != "allowed"
        where = _where(str(e.get("host", "-")), _num(e.get("port")))
        kind = e.get("kind") or ""
        text = f"{verdict.upper() if bad else verdict} {where} {kind}".rstrip()
        if "method" in e:
            text += f" {e['method']} {e.get('path', '')} {e.get('status', '-')}"
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
    line = f"{stamp} {'!!' if bad else '  '} {ev!s:<6} {text}"
    return f"\x1b[1;31m{line}\x1b[0m" if bad and color else line


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
        start = next((e for e in events if e.get("ev") == "start"), {})
        out.write(propose(events, start.get("inject") or ()) + "\n")
        return 0
    summary = summarize(events, record.verify(path))
    if args.get("--json"):
        out.write(json.dumps(summary, indent=2) + "\n")
    else:
        out.write(render(summary))
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


def current(directory: str) -> str:
    """The record ``watch`` follows: the newest one without its end event, else the newest."""
    ids = record.listing(directory)
    if not ids:
        raise UsageError(f"no session records in {directory}: is a session running?")
    for sid in reversed(ids):
        path = os.path.join(directory, sid + record.SUFFIX)
        lines = record.read_lines(path)
        try:
            ended = bool(lines) and json.loads(lines[-1]).get("ev") == "end"
        except ValueError:
            ended = False
        if not ended:
            return path
    return os.path.join(directory, ids[-1] + record.SUFFIX)


def watch(args: Mapping[str, Any], out: TextIO | None = None, home: str = "") -> int:
    """``agent-sandbox watch``: follow a record, one line per event, until its end."""
    out = out or sys.stdout
    directory = record.sessions_dir(home)
    which = args.get("SESSION")
    path = _open(which, False, home) if which else current(directory)
    color = out.isatty() and not os.environ.get("NO_COLOR")
    out.write(f"watching {path} (Ctrl-C to stop)\n")
    out.flush()
    try:
        for event in record.follow(path):
            out.write(watch_line(event, color=color) + "\n")
            out.flush()
    except KeyboardInterrupt:
        return 130
    return 0
