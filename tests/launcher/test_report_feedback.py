"""What a person at the terminal is told: the end-of-session line, --propose's whole
domains line, the report's ports (pure parts; test_session_feedback.py runs real sessions)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from libbroker.launcher import config, config_file, propose, record, report
from libbroker.launcher.refusals import HOSTS_SHOWN, NAME_MAX, Refusals

CONFIGURED = ["github.com", "api.github.com", "*.githubusercontent.com", "pypi.org",
              "db.internal:5432"]


def _refused(host: str, port: int = 443, why: str = "not on the allow list") -> dict[str, Any]:
    return {"ev": "egress", "host": host, "port": port, "verdict": "refused",
            "reason": f"403 {host}:{port} {why}"}


def _domains_of(line: str, tmp_path: Path) -> tuple[str, ...]:
    """The line through the launcher's own config loader, as a pasted config."""
    path = tmp_path / "config.toml"
    path.write_text(line + "\n")
    (tmp_path / "work").mkdir(exist_ok=True)
    facts = config.HostFacts(home=str(tmp_path / "home"), cwd=str(tmp_path / "work"),
                             gh_present=False)
    return config_file.load(str(path), facts).domains


def test_propose_keeps_every_configured_domain_and_adds_the_refused(tmp_path: Path) -> None:
    events = [_refused("example.com"), _refused("example.com", 80), _refused("pypi.org"),
              _refused("files.pythonhosted.org"), _refused("cache.example.org", 8443),
              {"ev": "egress", "host": "allowed.org", "port": 443, "verdict": "allowed"}]
    line = propose.propose(events, CONFIGURED, inject=["github.com", "api.github.com"])
    assert line == ('domains = ["github.com", "api.github.com", "*.githubusercontent.com", '
                    '"pypi.org", "db.internal:5432", "example.com", "files.pythonhosted.org", '
                    '"cache.example.org:8443"]')
    assert _domains_of(line, tmp_path) == (*CONFIGURED, "example.com", "files.pythonhosted.org",
                                           "cache.example.org:8443")


@pytest.mark.parametrize("host", [
    "localhost", "a.localhost", "127.0.0.1", "127.9.8.7", "[::1]", "[::ffff:127.0.0.1]",
    "0.0.0.0", "[::]",
])
def test_propose_never_adds_loopback(host: str) -> None:
    events = [_refused(host), _refused(host, 6443), {**_refused(host), "verdict": "allowed",
                                                     "learn": "not on the allow list"}]
    assert propose.propose(events, ["github.com"]) == 'domains = ["github.com"]'


def test_propose_adds_nothing_twice() -> None:
    configured = ["example.com", "*.cdn.test", "svc.test:8080", "example.com", "[2001:db8::1]"]
    events = [_refused("example.com", 80), _refused("example.com", 443),
              _refused("a.cdn.test"), _refused("svc.test", 8080), _refused("svc.test", 9090),
              _refused("[2001:db8::1]"), _refused("new.test"), _refused("new.test", 80),
              {**_refused("learned.test"), "verdict": "allowed", "learn": "x"}]
    assert propose.propose(events, configured) == (
        'domains = ["example.com", "*.cdn.test", "svc.test:8080", "[2001:db8::1]", '
        '"learned.test", "new.test", "svc.test:9090"]')


def test_propose_skips_what_a_domains_entry_would_not_open() -> None:
    events = [_refused("token-host.test"), _refused("private.test", why="is refused: private"),
              {**_refused("-"), "reason": "socks: bad host"},
              _refused("evil\\x1b[2J.test"), _refused("sp ace.test"), _refused("x.test", 0),
              {"ev": "egress", "host": "plain.test", "port": 80, "verdict": "failed",
               "reason": "502 not on the allow list"}]
    assert propose.propose(events, [], inject=["token-host.test"]) == "domains = []"


def test_propose_without_configured_domains_in_the_record(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """A record of an older launcher names no domains: the line says only the new, and why."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    rec = record.Record.create(record.sessions_dir(), "20250101-000000-aaaaaa")
    rec.append("start", {"id": "20250101-000000-aaaaaa", "inject": []})
    rec.append("egress", _refused("new.test"))
    rec.close()
    out = io.StringIO()
    assert report.main({"--propose": True}, out) == 0
    assert out.getvalue() == 'domains = ["new.test"]\n'
    assert "does not name the session's domains" in capsys.readouterr().err


def test_the_table_says_which_port() -> None:
    events = [{"ev": "egress", "host": "example.com", "port": 80, "verdict": "allowed",
               "up": 1, "down": 2}, _refused("example.com", 443)]
    text = report.render(report.summarize(events))
    rows = [line.split() for line in text.splitlines() if line.startswith("  example.com ")]
    assert rows == [["example.com", "80", "1", "1", "B", "2", "B", "0"],
                    ["example.com", "443", "0", "0", "B", "0", "B", "1"]]
    assert "  host          port  requests" in text
    assert "  example.com:443: 403 example.com:443 not on the allow list" in text


def test_the_report_escapes_what_came_from_the_sandbox(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    rec = record.Record.create(record.sessions_dir(), "20250101-000000-bbbbbb")
    rec.append("start", {"id": "20250101-000000-bbbbbb"})
    rec.append("egress", {**_refused("a.test"), "reason": "x\x1b]0;owned\x07\u202e"})
    rec.close()
    out = io.StringIO()
    report.main({}, out)
    assert "\x1b" not in out.getvalue() and "\u202e" not in out.getvalue()
    assert "x\\x1b]0;owned\\x07" in out.getvalue()


# --- the end-of-session line -----------------------------------------------------------


def _tally(*events: tuple[str, dict[str, Any]]) -> Refusals:
    counted = Refusals()
    for ev, fields in events:
        counted.add(ev, fields)
    return counted


def test_no_line_when_nothing_was_refused() -> None:
    counted = _tally(("egress", {"host": "a.test", "port": 443, "verdict": "allowed"}),
                     ("egress", {"host": "b.test", "port": 443, "verdict": "failed"}),
                     ("broker", {"argv": ["false"], "exit": 1}), ("sign", {"exit": 0}))
    assert counted.line("S") is None


def test_the_line_counts_requests_and_names_each_host_once() -> None:
    counted = _tally(*(("egress", _refused(h, p)) for h, p in [
        ("example.com", 443), ("example.com", 80), ("pypi.org", 443), ("example.com", 443)]))
    assert counted.line("20250101-000000-cccccc") == (
        "agent-sandbox: 4 requests refused (example.com, pypi.org): "
        "agent-sandbox report 20250101-000000-cccccc")
    one = _tally(("egress", _refused("db.test", 5432)))
    assert one.line("S") == "agent-sandbox: 1 request refused (db.test:5432): " \
                            "agent-sandbox report S"


def test_the_line_is_bounded_and_escaped() -> None:
    hosts = ["evil\x1b[2J.test", "b\u202e.test", "x" * 500, *(f"h{i}.test" for i in range(50))]
    counted = _tally(*(("egress", _refused(h)) for h in hosts),
                     ("egress", {**_refused("-"), "reason": "socks: bad"}))
    line = counted.line("S")
    assert line is not None
    assert line.startswith("agent-sandbox: 54 requests refused (evil\\x1b[2J.test, "
                           "b\\x202e.test, " + "x" * (NAME_MAX - 3) + "..., "
                           f"{len(hosts) - HOSTS_SHOWN} more): agent-sandbox report S")
    assert line.isprintable() and len(line) < 300


def test_the_line_names_brokered_refusals_and_learn_mode() -> None:
    counted = _tally(("broker", {"argv": ["x"], "refused": "not allowed"}),
                     ("sign", {"key": "K", "refused": "key not enabled"}),
                     ("broker", {"argv": ["y"], "refused": "no"}))
    assert counted.line("S") == ("agent-sandbox: 2 brokered commands refused; 1 signature "
                                 "refused: agent-sandbox report S")
    learned = _tally(("egress", {"host": "a.test", "port": 443, "verdict": "allowed",
                                 "learn": "not on the allow list"}),
                     ("egress", {"host": "a.test", "port": 443, "verdict": "allowed",
                                 "learn": "not on the allow list"}))
    assert learned.line("S") == ("agent-sandbox: learn mode: the allow list would have refused "
                                 "1 host (a.test): agent-sandbox report --propose S")
