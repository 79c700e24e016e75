"""The session record's file: the chain, --verify, the report's text, learn mode's proposal."""

from __future__ import annotations

import io
import itertools
import json
import os
import stat
import time
from pathlib import Path

import pytest

from libbroker.launcher import propose, record, report, watch

SID = "20250102-150405-abcdef"

# A fixed session: what the report must say about it, word for word.
EVENTS: list[tuple[str, dict[str, object]]] = [
    ("start", {"id": SID, "workdir": "/home/u/src/proj", "backend": "bwrap",
               "config": "0" * 64, "cmd": ["claude"], "learn": False,
               "inject": ["github.com", "api.github.com"]}),
    ("egress", {"host": "api.github.com", "port": 443, "kind": "injected",
                "verdict": "allowed", "method": "GET", "path": "/user", "status": 200,
                "up": 0, "down": 2048, "dur": 0.12}),
    ("egress", {"host": "api.github.com", "port": 443, "kind": "injected",
                "verdict": "allowed", "method": "POST", "path": "/graphql", "status": 200,
                "up": 512, "down": 4096, "dur": 0.2}),
    ("egress", {"host": "pypi.org", "port": 443, "verdict": "refused",
                "reason": "403 pypi.org:443 is not on the allow list"}),
    ("egress", {"host": "api.anthropic.com", "port": 443, "kind": "tunnel",
                "verdict": "allowed", "up": 30000, "down": 1500000, "dur": 41.0}),
    ("egress", {"host": "localhost", "port": 6443, "verdict": "refused",
                "reason": "403 localhost is refused: loopback address"}),
    ("broker", {"argv": ["make", "test"], "cwd": "/home/u/src/proj", "exit": 0, "dur": 3.5}),
    ("broker", {"argv": ["false"], "cwd": "/home/u/src/proj", "exit": 1, "dur": 0.01}),
    ("sign", {"key": "ABCD1234", "exit": 0, "dur": 0.05}),
    ("end", {"exit": 0, "dur": 62.5}),
]

GOLDEN = """\
session 20250102-150405-abcdef: exit 0, 62.50 s, bwrap
  claude   in /home/u/src/proj

  host                port  requests         up       down  refused
  api.github.com       443         2      512 B    6.0 KiB        0
  api.anthropic.com    443         1   29.3 KiB    1.4 MiB        0
  localhost           6443         0        0 B        0 B        1
  pypi.org             443         0        0 B        0 B        1

refused (2):
  pypi.org:443: 403 pypi.org:443 is not on the allow list
    -> if it was needed: add "pypi.org" to domains in config.toml
  localhost:6443: 403 localhost is refused: loopback address
    -> an address rule: only for a lab host you trust, pin it (resolve = ["localhost:IP"]) \
or open its range (allow_cidr)

brokered commands: 2, 1 failed; slowest 3.50 s: make test
  failed (exit 1): false
signatures: 1 (1 made, 0 failed) with ABCD1234
record: chain intact
"""


def _write(directory: Path, events: list[tuple[str, dict[str, object]]] = EVENTS,
           sid: str = SID) -> Path:
    rec = record.Record.create(str(directory), sid)
    for ev, fields in events:
        assert rec.append(ev, fields)
    rec.close()
    return Path(rec.path)


def test_the_file_is_private_and_chained(tmp_path: Path) -> None:
    path = _write(tmp_path / "sessions")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[0])["prev"] == record.genesis(SID)
    for before, line in itertools.pairwise(lines):
        assert json.loads(line)["prev"] == record.digest(before)
    assert [json.loads(line)["seq"] for line in lines] == list(range(len(EVENTS)))
    assert record.verify(str(path)) == []


def test_ids_sort_in_the_order_sessions_started_within_one_second(tmp_path: Path) -> None:
    """'The newest' is the last id: two sessions in one second must not sort by chance."""
    made = []
    for _ in range(40):
        made.append(record.new_id())
        time.sleep(0.0011)  # each in a later millisecond, most in the same second
    assert sorted(made) == made
    assert all(len(sid) == len(SID) and sid[:15].replace("-", "").isdigit() for sid in made)
    with pytest.raises(FileExistsError):  # O_EXCL: a taken id is never shared
        (tmp_path / (made[0] + record.SUFFIX)).touch()
        record.Record.create(str(tmp_path), made[0])


def test_verify_fails_after_one_byte_is_changed(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.index(b'"exit":1')
    data[at + 7] = ord("0")  # the failing command "succeeded"
    path.write_bytes(bytes(data))
    problems = record.verify(str(path))
    assert any("chain breaks" in p for p in problems), problems


@pytest.mark.parametrize("which", [1, 5, -1])
def test_verify_fails_after_a_line_is_removed(tmp_path: Path, which: int) -> None:
    path = _write(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[which]
    path.write_bytes(b"".join(lines))
    assert record.verify(str(path)) != []


def test_verify_fails_on_a_cut_and_on_a_swapped_order(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    assert any("cut short" in p for p in record.verify(str(path)))
    lines = data.splitlines(keepends=True)
    lines[2], lines[3] = lines[3], lines[2]
    path.write_bytes(b"".join(lines))
    assert record.verify(str(path)) != []


def test_report_verify_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = _write(Path(record.sessions_dir()))
    out = io.StringIO()
    assert report.main({"--verify": True, "SESSION": SID[:10]}, out) == 0
    assert "chain intact, 10 lines" in out.getvalue()
    path.write_bytes(path.read_bytes().replace(b"make", b"mako"))
    out = io.StringIO()
    assert report.main({"--verify": True, "--last": True}, out) == 1
    assert "chain breaks" in out.getvalue()


def test_report_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    _write(Path(record.sessions_dir()))
    out = io.StringIO()
    assert report.main({"--last": True}, out) == 0
    assert out.getvalue() == GOLDEN


def test_report_json_and_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    _write(Path(record.sessions_dir()))
    _write(Path(record.sessions_dir()), EVENTS[:3], sid="20250103-090000-012345")
    out = io.StringIO()
    report.main({"--json": True, "SESSION": SID}, out)
    data = json.loads(out.getvalue())
    assert data["exit"] == 0 and data["verified"] is True
    assert data["commands"]["count"] == 2 and len(data["commands"]["failures"]) == 1
    assert [h["host"] for h in data["hosts"]][:2] == ["api.github.com", "api.anthropic.com"]
    out = io.StringIO()
    report.main({"--list": True}, out)
    rows = out.getvalue().splitlines()
    assert rows[0].startswith("20250103-090000-012345") and "running?" in rows[0]
    assert rows[1].startswith(SID) and "exit 0" in rows[1]


def test_propose_exact_names_and_wildcards_for_three_siblings() -> None:
    hosts = ["pypi.org", "files.pythonhosted.org", "a.cdn.example.com", "b.cdn.example.com",
             "c.cdn.example.com", "cdn.example.com", "x.two.org", "y.two.org", "github.com",
             "10.0.0.1", "registry.npmjs.org"]
    events = [{"ev": "egress", "host": h, "port": 443, "verdict": "allowed",
               "learn": "not on the allow list"} for h in hosts]
    events.append({"ev": "egress", "host": "db.example.net", "port": 5432, "verdict": "refused",
                   "reason": "socks blocked-by-allowlist: db.example.net:5432 is not on the "
                             "allow list"})
    events.append({"ev": "broker", "argv": ["true"]})
    line = propose.propose(events, inject=["github.com"])
    assert line == (
        'domains = ["10.0.0.1", "*.cdn.example.com", "cdn.example.com", '
        '"db.example.net:5432", "registry.npmjs.org", "pypi.org", '
        '"files.pythonhosted.org", "x.two.org", "y.two.org"]'
    )


def test_server_lines_become_events() -> None:
    audit = {"time": "x", "peer_pid": 7, "peer_uid": 1000, "op": "exec", "argv": ["ls"],
             "cwd": "/w", "duration": 0.5, "exit": 2}
    assert record.from_server("broker-server", json.dumps(audit)) == (
        "broker", {"argv": ["ls"], "cwd": "/w", "exit": 2, "dur": 0.5, "pid": 7})
    sign = {**audit, "op": "sign", "key": "K", "refused": "key not enabled"}
    assert record.from_server("broker-server", json.dumps(sign)) == (
        "sign", {"key": "K", "refused": "key not enabled", "dur": 0.5, "pid": 7})
    assert record.from_server("broker-server", json.dumps({**audit, "op": "ping"})) is None
    assert record.from_server("broker-server", "listening unix:/x") is None
    assert record.from_server("egress-proxy", '{"ev":"start","id":"forged"}') is None
    assert record.from_server("egress-proxy", '{"ev":"egress","host":"a"}') == (
        "egress", {"host": "a"})


def test_exposed_names_the_grant_that_reaches_the_record() -> None:
    assert record.exposed("/home/u/.local/state/agent-sandbox/sessions",
                          ("/usr", "/home/u/.local")) == "/home/u/.local"
    assert record.exposed("/home/u/.local/state/agent-sandbox/sessions",
                          ("/usr", "/home/u/.local/share", "/home/u/src")) is None


def test_watch_marks_refusals() -> None:
    refused = watch.watch_line({"ev": "egress", "t": 0, "host": "x.org", "port": 443,
                                "verdict": "refused", "reason": "not on the allow list"})
    assert " !! egress REFUSED x.org:443: not on the allow list" in refused
    ok = watch.watch_line({"ev": "broker", "t": 0, "argv": ["ls"], "exit": 0, "dur": 0.1})
    assert " !! " not in ok and "ls: exit 0 (0.10 s)" in ok
    assert os.environ.get("NO_COLOR") or True
