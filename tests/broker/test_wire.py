"""The frame codec, the splice-aware reader and request validation: pure, exhaustive, no I/O."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import ProtocolError, RequestRefused
from libbroker.wire import (
    CHANNEL_NAMES,
    CLIENT_CHANNELS,
    HEADER_SIZE,
    MAX_PAYLOAD,
    SERVER_CHANNELS,
    Channel,
    Data,
    Frame,
    FrameDecoder,
    Payload,
    Reader,
    Request,
    decode_exit,
    decode_signal,
    encode_error,
    encode_exit,
    encode_frame,
    encode_request,
    encode_signal,
    encode_stdin_eof,
    final_status,
    frame_header,
    parse_request,
)

frames_st = st.lists(
    st.tuples(st.integers(0, len(CHANNEL_NAMES) - 1), st.binary(max_size=300)), max_size=20
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@given(frames_st, st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_any_chunking_round_trips(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
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
        dec.feed(bytes([Channel.STDIN]) + b"\xff\xff\xff\xff")
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
    assert frame.channel == Channel.EXIT and decode_exit(frame.payload) == status


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
    assert frame.channel == Channel.REQUEST
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


# --- the splice-aware reader --------------------------------------------------

PASS = frozenset({Channel.STDOUT, Channel.STDERR})


def drive(reader: Reader, data: bytes, moves: list[int], splice: list[bool]) -> list[object]:
    """Run ``reader`` over ``data`` as a pump would: read only what it wants, and move
    announced payloads itself (``splice``) or feed them (``moves`` sizes the steps)."""
    got: list[object] = []
    pos, step = 0, 0
    while True:
        if reader.passing and splice[step % len(splice)]:
            count = min(reader.passing, moves[step % len(moves)] or 1)
            got.append(Data(-1, data[pos : pos + count]))  # moved by "us"
            reader.passed(count)
            pos += count
        else:
            event = reader.next_event()
            if event is not None:
                got.append(event)
                continue
            want = reader.want()
            if pos >= len(data):
                return got
            assert want > 0
            count = min(want, moves[step % len(moves)] or 1)
            reader.feed(data[pos : pos + count])
            pos += count
        step += 1


def joined(events: list[object]) -> list[tuple[int, bytes]]:
    """Frames as (channel, payload), however the payload travelled."""
    out: list[tuple[int, bytes]] = []
    for event in events:
        if isinstance(event, Frame):
            out.append((event.channel, event.payload))
        elif isinstance(event, Payload):
            out.append((event.channel, b""))
        else:
            assert isinstance(event, Data) and out
            out[-1] = (out[-1][0], out[-1][1] + event.data)
    return out


@given(
    frames_st.map(lambda fs: [(c, p) for c, p in fs if c in SERVER_CHANNELS]),
    st.lists(st.integers(0, 400), min_size=1, max_size=10),
    st.lists(st.booleans(), min_size=1, max_size=5),
)
def test_the_reader_never_reads_past_a_frame_and_passes_payloads_through(
    frames: list[tuple[int, bytes]], moves: list[int], splice: list[bool]
) -> None:
    data = b"".join(encode_frame(c, p) for c, p in frames)
    reader = Reader(SERVER_CHANNELS, passthrough=PASS)
    events = drive(reader, data, moves, splice)
    assert joined(events) == frames
    announced = [e for e in events if isinstance(e, Payload)]
    assert [(e.channel, e.size) for e in announced] == [(c, len(p)) for c, p in frames
                                                         if c in PASS and p]  # fmt: skip
    assert reader.buffered == 0 and reader.passing == 0 and reader.want() == HEADER_SIZE


def test_a_passthrough_header_is_announced_before_its_payload_is_read() -> None:
    reader = Reader(SERVER_CHANNELS, passthrough=PASS)
    reader.feed(frame_header(Channel.STDOUT, 1000))
    assert reader.next_event() == Payload(Channel.STDOUT, 1000)
    assert (reader.passing, reader.want(), reader.next_event()) == (1000, 1000, None)
    reader.passed(600)
    reader.feed(b"x" * 100)  # or fed: handed back as data
    assert reader.next_event() == Data(Channel.STDOUT, b"x" * 100)
    with pytest.raises(ValueError):
        reader.passed(301)
    reader.passed(300)
    assert reader.want() == HEADER_SIZE
    reader.feed(encode_frame(Channel.STDOUT))  # an empty payload is a frame, never announced
    assert reader.next_event() == Frame(Channel.STDOUT, b"")


def test_a_bad_header_comes_after_the_frames_before_it_then_poisons() -> None:
    """Stream order, however the bytes arrived (the C fast path does the same)."""
    reader = Reader(SERVER_CHANNELS)
    reader.feed(encode_frame(Channel.STDOUT, b"sig") + encode_error("no") + encode_stdin_eof())
    assert reader.next_event() == (Channel.STDOUT, b"sig")
    assert reader.next_event() == (Channel.ERROR, b"no")
    with pytest.raises(ProtocolError, match="channel stdin is not allowed here"):
        reader.next_event()
    with pytest.raises(ProtocolError):
        reader.feed(b"")
    with pytest.raises(ProtocolError):
        reader.next_event()


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (bytes([9, 0, 0, 0, 0]), "unknown channel 9"),
        (bytes([0, 0, 0, 0, 0]), "channel stdin is not allowed here"),
        (bytes([6, 0, 0, 0, 1]), "channel signal is not allowed here"),
        (bytes([1, 0xFF, 0xFF, 0xFF, 0xFF]), "exceeds the 1048576-byte limit"),
    ],
)
def test_a_bad_header_is_refused_before_its_payload(header: bytes, message: str) -> None:
    reader = Reader(SERVER_CHANNELS, passthrough=PASS)
    reader.feed(header)
    with pytest.raises(ProtocolError, match=message):
        reader.next_event()


def test_final_status() -> None:
    assert final_status(Frame(Channel.EXIT, b"\xff\xff\xff\xff")) == 255
    assert final_status(Frame(Channel.STDOUT, b"x")) is None
    with pytest.raises(RequestRefused, match="nope"):
        final_status(Frame(Channel.ERROR, b"nope"))
    with pytest.raises(ProtocolError, match="expected 4"):
        final_status(Frame(Channel.EXIT, b"\0"))


def test_request_equality_and_without_stdin() -> None:
    request = Request(("a",), "/w", op="sign", key="K")
    assert request == Request(("a",), "/w", True, "sign", "K") != request.without_stdin()
    assert request.without_stdin().with_stdin is False
    assert len({request, Request(("a",), "/w", True, "sign", "K")}) == 1
    assert "key='K'" in repr(request)
