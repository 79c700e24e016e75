"""The allow list's pattern forms, as the contract lists them."""

from __future__ import annotations

import pytest

from libegress.allowlist import allowed, parse_pattern, parse_patterns
from libegress.hosts import BadHost, canonical_host

PATTERNS = parse_patterns(
    "example.com, *.wild.test, api.example.org:8443, 127.0.0.1:6443, [::1]:9000, Bücher.Example"
)


@pytest.mark.parametrize(
    ("host", "port", "ok"),
    [
        ("example.com", 443, True),
        ("example.com", 80, True),
        ("example.com", 8080, False),
        ("EXAMPLE.COM.", 443, True),
        ("www.example.com", 443, False),
        ("wild.test", 443, False),
        ("a.wild.test", 443, True),
        ("a.b.wild.test", 80, True),
        ("a.wild.test", 22, False),
        ("evilwild.test", 443, False),
        ("api.example.org", 8443, True),
        ("api.example.org", 443, False),
        ("127.0.0.1", 6443, True),
        ("2130706433", 6443, True),
        ("0x7f.1", 6443, True),
        ("127.0.0.1", 443, False),
        ("[::1]", 9000, True),
        ("[0::1]", 9000, True),
        ("bücher.example", 443, True),
        ("xn--bcher-kva.example", 443, True),
        ("example.com.evil.test", 443, False),
    ],
)
def test_allow_list(host: str, port: int, ok: bool) -> None:
    assert allowed(PATTERNS, canonical_host(host), port) is ok


@pytest.mark.parametrize("text", ["*", "*.", "a.*.com", "ex*ample.com", "example.com:x",
                                  "example.com:0", "*.127.0.0.1", "[::1", "[::1]x"])
def test_bad_patterns_are_refused(text: str) -> None:
    with pytest.raises(BadHost):
        parse_pattern(text)


def test_empty_items_are_skipped() -> None:
    assert parse_patterns(" , ,") == ()
    assert len(parse_patterns("a.com,,b.com")) == 2
