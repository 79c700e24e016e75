"""The stress report: one markdown table per area, then every finding in full."""

from __future__ import annotations

import datetime
import os

from stress.common import Finding, Mode, Table


def render(tables: list[Table], findings: list[Finding], mode: Mode,
           timings: list[tuple[str, float]], total: float, machine: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# agent-sandbox stress report\n",
        f"`python3 bench/stress.py{' --quick' if mode.quick else ''}` · {when} · "
        f"{machine} · {os.cpu_count()} cores shared · total {total:.0f} s "
        f"({', '.join(f'{n} {s:.0f} s' for n, s in timings)}). All traffic on loopback.\n",
        f"**Findings: {len(findings)}** (each marked FINDING n in the tables, listed at the "
        "end with the command, the input, what happened and what should have).\n",
    ]
    parts.append("### Summary\n\n| table | rows | rows with a finding |\n|---|---|---|")
    for t in tables:
        flagged = sum(1 for r in t.rows if any("FINDING" in c for c in r))
        flagged += sum(1 for n in t.notes if n.startswith("**FINDING"))
        parts.append(f"| {t.title} | {len(t.rows)} | {flagged} |")
    parts.append("")
    parts += [t.markdown() for t in tables]
    parts.append("## Findings\n")
    if findings:
        parts += [f"{i}. " + f.markdown().removeprefix("- ") for i, f in
                  enumerate(findings, 1)]
    else:
        parts.append("None.")
    return "\n".join(parts) + "\n"
