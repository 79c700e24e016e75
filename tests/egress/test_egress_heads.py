"""Request-head screening and header rewriting (pure)."""

from __future__ import annotations

import base64

import pytest

from libegress.heads import (
    authorization,
    forward_headers,
    head_end,
    same_host,
    smuggling_reason,
)

OK = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
         "both"),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
         "duplicate"),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n", "list"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", "folding"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\tc\r\n\r\n", "folding"),
        (b"GET / HTTP/1.1\nHost: a\n\n", "bare LF"),
        (b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", "bare LF"),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", "whitespace"),
    ],
)
def test_smuggling_heads_are_refused(head: bytes, why: str) -> None:
    reason = smuggling_reason(head)
    assert reason is not None and why in reason


def test_plain_heads_pass() -> None:
    assert smuggling_reason(OK) is None
    chunked = b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert smuggling_reason(chunked) is None


def test_head_end() -> None:
    assert head_end(OK + b"abc") == len(OK)
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\r\n") is None


def test_forward_headers_drops_hop_by_hop_and_credentials() -> None:
    headers = [
        (b"Host", b"api.github.com"),
        (b"Authorization", b"token forged"),
        (b"authorization", b"Basic Zm9v"),
        (b"Proxy-Authorization", b"Basic Zm9v"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"Connection", b"keep-alive, X-Secret-Hop"),
        (b"X-Secret-Hop", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Upgrade", b"h2c"),
        (b"TE", b"trailers"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Accept", b"*/*"),
    ]
    out = forward_headers(headers, drop_auth=True)
    assert out == [(b"Host", b"api.github.com"), (b"Accept", b"*/*"),
                   (b"Transfer-Encoding", b"chunked")]
    kept = forward_headers([(b"Authorization", b"x")], drop_auth=False)
    assert kept == [(b"Authorization", b"x")]


def test_authorization_forms() -> None:
    basic = authorization("github.com", "T0K")
    assert basic == b"Basic " + base64.b64encode(b"x-access-token:T0K")
    assert authorization("api.github.com", "T0K") == b"Bearer T0K"
    assert authorization("uploads.github.com", "T0K") == b"Bearer T0K"


@pytest.mark.parametrize(
    ("value", "ok"),
    [(b"api.github.com", True), (b"API.GitHub.com.", True), (b"api.github.com:443", True),
     (b"api.github.com:444", False), (b"evil.test", False), (b"api.github.com@evil.test", False),
     (b"", False), (b"api.github.com.evil.test", False)],
)
def test_same_host(value: bytes, ok: bool) -> None:
    assert same_host(value, "api.github.com", 443) is ok
