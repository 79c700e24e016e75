"""How watch tells a live session from one whose launcher is gone (test_session_feedback.py
does it with real sessions and SIGKILL; here each case of the rule, with real processes)."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

from libbroker.launcher import record, watch


def _gone_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _record(directory: Path, sid: str, pid: object, *, ended: bool = False,
            t: float | None = None) -> Path:
    rec = record.Record.create(str(directory), sid)
    fields: dict[str, object] = {"id": sid, "pid": pid, "cmd": ["x"]}
    assert rec.append("start", fields)
    if t is not None:  # a start written at another time than now
        rec.close()
        path = Path(rec.path)
        line = path.read_text().replace('"t":', f'"t":{t},"old_t":', 1)
        path.write_text(line)
        return path
    if ended:
        rec.append("end", {"exit": 0, "dur": 0.1})
    rec.close()
    return Path(rec.path)


def test_a_running_launcher_is_alive_and_a_gone_one_is_not() -> None:
    assert watch.launcher_alive({"pid": os.getpid(), "t": time.time()})
    assert not watch.launcher_alive({"pid": _gone_pid(), "t": time.time()})
    for pid in (None, "12", 0, -1, True):
        assert not watch.launcher_alive({"pid": pid, "t": time.time()})


def test_a_reused_pid_is_not_the_launcher() -> None:
    """A process that started after the record was written cannot have written it."""
    later = subprocess.Popen(["sleep", "30"])
    try:
        assert watch.launcher_alive({"pid": later.pid, "t": time.time()})
        assert not watch.launcher_alive({"pid": later.pid, "t": time.time() - 3600})
    finally:
        later.kill()
        later.wait()


def test_a_zombie_launcher_is_gone() -> None:
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert not watch.launcher_alive({"pid": zombie.pid, "t": time.time()})
    finally:
        zombie.wait()


def test_ends_reads_the_first_and_last_lines(tmp_path: Path) -> None:
    path = _record(tmp_path, "20250101-000000-000001", os.getpid(), ended=True)
    start, ended = watch.ends(str(path))
    assert start["pid"] == os.getpid() and ended
    path.write_bytes(path.read_bytes()[:-5])  # cut: no whole end event
    assert watch.ends(str(path))[1] is False
    assert watch.ends(str(tmp_path / "missing.jsonl")) == ({}, False)


def test_newest_live_skips_the_dead_and_ended_and_bounds_what_it_says(tmp_path: Path) -> None:
    live = _record(tmp_path, "20250101-000000-000001", os.getpid())
    for n in range(2, 8):
        _record(tmp_path, f"20250101-000000-00000{n}", _gone_pid())
    _record(tmp_path, "20250101-000000-000009", os.getpid(), ended=True)
    err = io.StringIO()
    assert watch.newest_live(str(tmp_path), err) == str(live)
    lines = err.getvalue().splitlines()
    assert len(lines) == watch.SAID + 1, lines
    assert lines[0].startswith("agent-sandbox watch: session 20250101-000000-000007 has no end")
    assert lines[-1] == "agent-sandbox watch: and 3 more sessions like it"


def test_newest_live_with_none_says_so(tmp_path: Path) -> None:
    err = io.StringIO()
    assert watch.newest_live(str(tmp_path / "none"), err) is None
    assert "no session records in" in err.getvalue()
    _record(tmp_path, "20250101-000000-000001", os.getpid(), t=time.time() - 3600 * 24 * 365)
    err = io.StringIO()
    assert watch.newest_live(str(tmp_path), err) is None
    assert err.getvalue().splitlines()[-1] == (
        "agent-sandbox watch: no live session; the newest is 20250101-000000-000001 "
        "(agent-sandbox report 20250101-000000-000001)")


def test_follow_takes_the_last_lines_written_before_the_writer_went(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"ev":"start"}\n{"ev":"egress"}\n')
    asked = []

    def stop() -> bool:
        if not asked:  # the writer's last line lands as it goes
            with path.open("a") as fh:
                fh.write('{"ev":"broker"}\n')
        asked.append(1)
        return True

    seen = [e["ev"] for e in watch.follow(str(path), poll=0.01, stop=stop)]
    assert seen == ["start", "egress", "broker"]
