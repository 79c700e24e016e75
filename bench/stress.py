"""The stress suite: load, faults, fuzzing and attacks, with a report (`just stress`).

Usage: python3 bench/stress.py [--quick] [--only AREA[,AREA]] [--out FILE]

AREA is fuzz, load, faults or attacks (default: all, in that order).  The full
run takes the issue's figures (200 broker clients and 1,000 proxy tunnels for
60 s each, ...) and several minutes; --quick runs every part for a few
seconds.  All traffic stays on loopback and every loop is bounded in count
and time.  The report (one markdown table per area, then the findings) is
printed and written to bench/results/stress.md (full run; the committed
report) or to $TMPDIR/stress-quick.md (--quick), or to --out.
"""

from __future__ import annotations

import argparse
import platform
import resource
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stress import common, report

AREAS = ("fuzz", "load", "faults", "attacks")


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _area(name: str, mode: common.Mode, tmp: Path) -> list[common.Table]:
    if name == "fuzz":
        from stress import fuzz
        return fuzz.run(mode, tmp)
    if name == "load":
        from stress import load
        return load.run(mode, tmp)
    if name == "faults":
        from stress import faults
        return faults.run(mode, tmp)
    from stress import attacks
    return attacks.run(mode, tmp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds per part")
    parser.add_argument("--only", default=",".join(AREAS), help="comma-separated areas")
    parser.add_argument("--out", help="where the markdown report goes")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    areas = [a.strip() for a in args.only.split(",") if a.strip()]
    unknown = [a for a in areas if a not in AREAS]
    if unknown:
        parser.error(f"unknown area {unknown[0]!r}; pick from {', '.join(AREAS)}")
    mode = common.Mode.make(args.quick)
    _raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="stress-"))
    tables: list[common.Table] = []
    timings: list[tuple[str, float]] = []
    started = time.monotonic()
    try:
        for name in areas:
            t0 = time.monotonic()
            print(f"== {name} ...", flush=True)
            try:
                tables += _area(name, mode, tmp)
            except Exception as exc:
                detail = traceback.format_exc(limit=6)
                print(detail, file=sys.stderr)
                table = common.Table(f"{name}: the harness itself failed", ["error"])
                table.add(f"{type(exc).__name__}: {exc}")
                tables.append(table)
            timings.append((name, time.monotonic() - t0))
            print(f"== {name} done in {timings[-1][1]:.0f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    text = report.render(tables, common.FINDINGS, mode, timings, time.monotonic() - started,
                         f"{platform.node()} · {platform.python_version()} · "
                         f"{platform.machine()}")
    print()
    print(text)
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.gettempdir()) / "stress-quick.md"
    else:
        out = Path(__file__).resolve().parent / "results" / "stress.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
