"""The gateway's pure parts: credentials on the wire and control frames (no sockets)."""

from __future__ import annotations

import base64
import json

import pytest

from libegress import proxyauth
from libegress.control_frames import (
    MAX_LINE,
    Add,
    BadFrame,
    List,
    Remove,
    parse_request,
    policy_args,
)
from libegress.proxyauth import BadCredentials, Credentials, parse_basic, parse_userpass


def _basic(text: bytes) -> bytes:
    return b"Basic " + base64.b64encode(text)


def test_basic_credentials_are_read_and_every_other_form_refused() -> None:
    assert parse_basic([_basic(b"t1:pa:ss")]) == Credentials("t1", "pa:ss")
    assert parse_basic([b"bAsIc  " + base64.b64encode(b"t1:")]) == Credentials("t1", "")
    refused = {
        "missing": [],
        "twice": [_basic(b"a:b"), _basic(b"a:b")],
        "bearer": [b"Bearer abc"],
        "no colon": [_basic(b"t1")],
        "not base64": [b"Basic !!!"],
        "not utf-8": [_basic(b"\xff:\xfe")],
        "empty": [b""],
    }
    for name, values in refused.items():
        with pytest.raises(BadCredentials) as caught:
            parse_basic(values)
        wanted = proxyauth.MISSING if name == "missing" else proxyauth.MALFORMED
        assert str(caught.value) == wanted, name


@pytest.mark.parametrize("size", [0, 1, 254, 255])
def test_rfc1929_request_of_every_size_reads_whole_and_waits_when_cut(size: int) -> None:
    user, password = "u" * size, "p" * (255 - size)
    wire = proxyauth.userpass_request(user, password)
    for cut in range(len(wire)):
        assert parse_userpass(wire[:cut]) is None
    assert parse_userpass(wire + b"\x05rest") == (Credentials(user, password), len(wire))


def test_rfc1929_bad_version_and_bytes_are_refused() -> None:
    with pytest.raises(BadCredentials):
        parse_userpass(b"\x05\x01u\x01p")
    with pytest.raises(BadCredentials):
        parse_userpass(b"\x01\x01\xff\x01p")


def test_matching_is_by_digest_and_an_unknown_tenant_never_matches() -> None:
    password = proxyauth.mint_password()
    assert len(password) == 43
    stored = proxyauth.digest(password)
    assert proxyauth.matches(stored, password)
    assert not proxyauth.matches(stored, password + "x")
    assert not proxyauth.matches(None, password)
    assert not proxyauth.matches(None, "")


def test_control_frames_parse_into_requests() -> None:
    assert parse_request(b'{"op": "list"}') == List()
    assert parse_request(b'{"op": "remove", "tenant": "s-1.a_b"}') == Remove("s-1.a_b")
    frame = {"op": "add", "tenant": "s1", "password": "x" * 24,
             "policy": {"allow": "a.test", "resolve": ["a.test:127.0.0.1"], "learn": True,
                        "token_every": 60}}
    add = parse_request(json.dumps(frame).encode())
    assert add == Add("s1", "x" * 24, frame["policy"])  # type: ignore[arg-type]
    assert isinstance(add, Add)
    assert policy_args(add.policy, "127.0.0.1:1") == {
        "--listen": "127.0.0.1:1", "--allow": "a.test", "--resolve": ["a.test:127.0.0.1"],
        "--learn": True, "--token-every": "60"}


@pytest.mark.parametrize(("line", "wanted"), [
    (b"", "not a JSON object"),
    (b"null", "not a JSON object"),
    (b'{"op": 1}', '"op" must be'),
    (b'{"op": "add"}', '"tenant" must be'),
    (b'{"op": "add", "tenant": ".hidden"}', '"tenant" must be'),
    (b'{"op": "add", "tenant": "a:b"}', '"tenant" must be'),
    (b'{"op": "add", "tenant": "' + b"a" * 65 + b'"}', '"tenant" must be'),
    (b'{"op": "add", "tenant": "a", "password": "has a space in it, long enough"}',
     '"password" must be'),
    (b'{"op": "add", "tenant": "a", "policy": []}', '"policy" must be an object'),
    (b'{"op": "add", "tenant": "a", "policy": {"resolve": "x"}}', "list of strings"),
    (b'{"op": "add", "tenant": "a", "policy": {"resolve": [1]}}', "list of strings"),
    (b'{"op": "add", "tenant": "a", "policy": {"learn": "yes"}}', "must be a bool"),
    (b'{"op": "add", "tenant": "a", "policy": {"token_every": true}}', "must be a str"),
    (b'{"op": "remove", "tenant": "a", "policy": {}}', "unknown key 'policy'"),
])
def test_malformed_frames_are_refused_with_a_reason(line: bytes, wanted: str) -> None:
    with pytest.raises(BadFrame) as caught:
        parse_request(line)
    assert wanted in str(caught.value)


def test_a_refused_password_is_never_echoed() -> None:
    secret = "sk-live-" + "9" * 10  # too short to be accepted
    with pytest.raises(BadFrame) as caught:
        parse_request(json.dumps({"op": "add", "tenant": "a", "password": secret}).encode())
    assert secret not in str(caught.value)
    assert MAX_LINE == 65536
