"""SOCKS5 wire parsing (RFC 1928), pure."""

from __future__ import annotations

import pytest

from libegress.socks5 import (
    ADDRESS_NOT_SUPPORTED,
    COMMAND_NOT_SUPPORTED,
    ConnectRequest,
    SocksError,
    parse_greeting,
    parse_request,
    reply,
)


def test_greeting() -> None:
    assert parse_greeting(b"\x05") is None
    assert parse_greeting(b"\x05\x02\x00") is None
    assert parse_greeting(b"\x05\x02\x00\x02") == (frozenset({0, 2}), 4)
    with pytest.raises(SocksError):
        parse_greeting(b"\x04\x01\x00")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x05\x01\x00\x01\x7f\x00\x00\x01\x19\xeb", ConnectRequest("127.0.0.1", 6635, 10)),
        (b"\x05\x01\x00\x03\x0agithub.com\x01\xbb", ConnectRequest("github.com", 443, 17)),
        (b"\x05\x01\x00\x04" + bytes(15) + b"\x01\x00\x50", ConnectRequest("[::1]", 80, 22)),
        (b"\x05\x01\x00\x03\x0agithub.com\x01", None),
        (b"\x05\x01\x00\x01\x7f\x00", None),
        (b"\x05\x01\x00", None),
    ],
)
def test_requests(data: bytes, expected: ConnectRequest | None) -> None:
    assert parse_request(data) == expected


def test_unsupported_requests() -> None:
    with pytest.raises(SocksError) as bind:
        parse_request(b"\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50")
    assert bind.value.code == COMMAND_NOT_SUPPORTED
    with pytest.raises(SocksError) as atyp:
        parse_request(b"\x05\x01\x00\x09\x00")
    assert atyp.value.code == ADDRESS_NOT_SUPPORTED


def test_reply() -> None:
    assert reply(0) == b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    assert reply(2, ("::1", 80)) == b"\x05\x02\x00\x04" + bytes(15) + b"\x01\x00\x50"
