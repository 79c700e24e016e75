"""The frame codec and request validation: pure, exhaustive, no I/O."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import ProtocolError, RequestRefused
from libbroker.wire import (
    CLIENT_CHANNELS,
    HEADER,
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    Channel,
    Frame,
    FrameDecoder,
    Request,
    decode_exit,
    decode_signal,
    encode_error,
    encode_exit,
    encode_frame,
    encode_request,
    encode_signal,
    encode_stdin_eof,
    frame_header,
    parse_request,
)

frames_st = st.lists(
    st.tuples(st.sampled_from(list(Channel)), st.binary(max_size=300)), max_size=20
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@given(frames_st, st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_any_chunking_round_trips(frames: list[tuple[Channel, bytes]], cuts: list[int]) -> None:
    data = b"".join(encode_frame(c, p) for c, p in frames)
    dec = FrameDecoder()
    got: list[Frame] = []
    for chunk in chunked(data, cuts):
        got.extend(dec.feed(chunk))
    assert got == [Frame(c, p) for c, p in frames]
    assert dec.buffered == 0


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=3000), max_size=10))
def test_garbage_never_crashes_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    dec = FrameDecoder(accept=CLIENT_CHANNELS)
    try:
        for chunk in chunked(data, cuts):
            for frame in dec.feed(chunk):
                assert frame.channel in CLIENT_CHANNELS
                assert len(frame.payload) <= MAX_PAYLOAD
    except ProtocolError:
        with pytest.raises(ProtocolError):  # poisoned: no resynchronisation
            dec.feed(b"")


@given(st.binary(max_size=500))
def test_garbage_requests_are_refused_not_crashed(data: bytes) -> None:
    with contextlib.suppress(RequestRefused):
        parse_request(data)


def test_oversized_length_refused_from_header_alone() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="exceeds"):
        dec.feed(HEADER.pack(Channel.STDIN, 0xFFFFFFFF))
    assert dec.buffered < 10


def test_max_payload_is_accepted() -> None:
    payload = b"x" * MAX_PAYLOAD
    assert FrameDecoder().feed(encode_frame(Channel.STDOUT, payload)) == [
        Frame(Channel.STDOUT, payload)
    ]
    with pytest.raises(ValueError):
        frame_header(Channel.STDOUT, MAX_PAYLOAD + 1)


def test_unknown_and_wrong_direction_channels_refused() -> None:
    with pytest.raises(ProtocolError, match="unknown channel 9"):
        FrameDecoder().feed(b"\x09\x00\x00\x00\x00")
    with pytest.raises(ProtocolError, match="not allowed"):
        FrameDecoder(accept=CLIENT_CHANNELS).feed(encode_exit(0))
    with pytest.raises(ProtocolError, match="not allowed"):
        FrameDecoder(accept=SERVER_CHANNELS).feed(encode_stdin_eof())


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_exit_round_trip(status: int) -> None:
    [frame] = FrameDecoder().feed(encode_exit(status))
    assert frame.channel is Channel.EXIT and decode_exit(frame.payload) == status


def test_small_helpers() -> None:
    assert encode_stdin_eof() == b"\x00\x00\x00\x00\x00"
    assert decode_signal(encode_signal(2)[5:]) == 2
    with pytest.raises(ProtocolError):
        decode_signal(b"")
    with pytest.raises(ProtocolError):
        decode_exit(b"\x00")
    assert encode_error("nope")[5:] == b"nope"


@given(
    st.lists(st.text(st.characters(blacklist_characters="\0"), max_size=20), min_size=1),
    st.text(st.characters(blacklist_characters="\0"), max_size=30),
    st.booleans(),
)
def test_request_round_trip(argv: list[str], cwd: str, with_stdin: bool) -> None:
    req = Request(argv=tuple(argv), cwd="/" + cwd, with_stdin=with_stdin)
    [frame] = FrameDecoder().feed(encode_request(req))
    assert frame.channel is Channel.REQUEST
    assert parse_request(frame.payload) == req


def req(**fields: object) -> bytes:
    body: dict[str, object] = {"argv": ["true"], "cwd": "/w", "with_stdin": False}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (req(env={"LD_PRELOAD": "/x.so"}), "'env' is refused"),
        (req(extra=1), "unknown request field 'extra'"),
        (req(argv=[]), "'argv' must be a non-empty list"),
        (req(argv="true"), "'argv' must be a non-empty list"),
        (req(argv=["a", 1]), "'argv' must be a non-empty list"),
        (req(argv=["a\0b"]), "NUL"),
        (req(cwd="relative"), "'cwd' must be an absolute path"),
        (req(cwd=5), "'cwd' must be an absolute path"),
        (req(with_stdin="yes"), "'with_stdin'"),
        (req(op="shell"), "'op' must be one of"),
        (req(op="sign"), "'key' must be a non-empty string"),
        (req(key="ABCD"), "'key' is only allowed with op sign"),
        (b"[1,2]", "not a JSON object"),
        (b"\xff\xfe", "not a UTF-8 JSON object"),
        (b"{", "not a UTF-8 JSON object"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"a":' * 50_000, "nested too deeply|not a UTF-8 JSON"),
    ],
)
def test_request_refusals_name_the_field(payload: bytes, message: str) -> None:
    with pytest.raises(RequestRefused, match=message):
        parse_request(payload)


def test_sign_and_ping_requests() -> None:
    sign = parse_request(b'{"op":"sign","key":"ABCD","with_stdin":true}')
    assert (sign.op, sign.key, sign.argv, sign.with_stdin) == ("sign", "ABCD", (), True)
    assert parse_request(b'{"op":"ping"}').op == "ping"
    assert parse_request(Request((), "/", op="sign", key="K").to_json()).key == "K"


@given(
    st.lists(st.text(), min_size=1, max_size=4), st.text(), st.booleans(),
    st.sampled_from(["exec", "sign", "ping"]), st.one_of(st.none(), st.text()),
)  # fmt: skip
def test_request_json_is_what_json_dumps_makes(
    argv: list[str], cwd: str, with_stdin: bool, op: str, key: str | None
) -> None:
    """The hand encoder (no json import on the client) writes json.dumps's bytes exactly."""
    request = Request(tuple(argv), "/" + cwd, with_stdin, op, key)
    body: dict[str, object] = {"argv": argv, "cwd": "/" + cwd, "with_stdin": with_stdin}
    if op != "exec":
        body["op"] = op
    if key is not None:
        body["key"] = key
    assert request.to_json() == json.dumps(body, separators=(",", ":")).encode()
