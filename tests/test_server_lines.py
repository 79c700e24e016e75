"""The codec of what the servers print to the launcher: both sides of each line."""

from __future__ import annotations

from libbroker.server_lines import (
    event_line,
    is_event,
    listening_line,
    listening_url,
    parse_event,
)


def test_a_listening_line_reads_back_as_its_url() -> None:
    for url in ("http://127.0.0.1:41234", "socks5://[::1]:1080", "unix:/run/b.sock"):
        assert listening_url(listening_line(url)) == url
    for other in ("", "listening", "listening a b", "Listening http://x:1", '{"ev": 1}'):
        assert listening_url(other) is None


def test_an_event_line_reads_back_and_nothing_else_is_an_event() -> None:
    entry = {"ev": "egress", "host": "a.test", "port": 443, "up": 0}
    line = event_line(entry)
    assert line == '{"ev":"egress","host":"a.test","port":443,"up":0}\n'
    assert is_event(line) and parse_event(line.rstrip("\n"), 4096) == entry
    assert not is_event(listening_line("unix:/x"))
    for bad in ("{", "{not json}", "[1]", '"{"', ""):
        assert parse_event(bad, 4096) is None
    assert parse_event(line.rstrip("\n"), 10) is None  # over the reader's bound
