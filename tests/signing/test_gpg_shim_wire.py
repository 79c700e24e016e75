"""gpg-shim's own small copy of the wire format agrees with libbroker.wire."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import libbroker
from libbroker import gpg_shim, wire
from libbroker.errors import ProtocolError


def test_constants_are_the_wire_formats() -> None:
    assert gpg_shim.MAX_PAYLOAD == wire.MAX_PAYLOAD
    assert gpg_shim.HEADER_SIZE == wire.HEADER_SIZE
    for name in ("STDIN", "STDOUT", "STDERR", "EXIT", "ERROR", "REQUEST"):
        assert getattr(gpg_shim, name) == wire.Channel[name]
    assert tuple(c.name.lower() for c in wire.Channel) == gpg_shim.CHANNEL_NAMES
    assert gpg_shim.SERVER_CHANNELS == wire.SERVER_CHANNELS


@given(st.text(min_size=1), st.text())
def test_the_sign_request_is_what_wire_encodes_and_parses(key: str, cwd: str) -> None:
    cwd = "/" + cwd
    made = gpg_shim.sign_request(key, cwd)
    expected = wire.Request(("gpg", "--status-fd=2", "-bsau", key), cwd, True, "sign", key)
    assert made == expected.to_json()
    if "\0" not in cwd + key:  # NUL is refused in argv and cwd (wire.parse_request)
        assert wire.parse_request(made) == expected


@given(st.binary(max_size=3000), st.integers(1, 4))
def test_sign_frames_decode_to_the_payload(payload: bytes, split: int) -> None:
    data = gpg_shim.sign_frames("KEY", "/w", payload)
    frames = wire.FrameDecoder(accept=wire.CLIENT_CHANNELS).feed(data)
    assert frames[0].channel is wire.Channel.REQUEST
    assert [f.channel for f in frames[1:]] == [wire.Channel.STDIN] * (len(frames) - 1)
    assert b"".join(f.payload for f in frames[1:]) == payload
    assert frames[-1].payload == b""


def test_a_big_payload_is_split_at_the_frame_limit() -> None:
    payload = os.urandom(wire.MAX_PAYLOAD * 2 + 7)
    frames = wire.FrameDecoder().feed(gpg_shim.sign_frames("K", "/", payload))
    assert [len(f.payload) for f in frames[1:]] == [wire.MAX_PAYLOAD, wire.MAX_PAYLOAD, 7, 0]


server_frames = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([wire.Channel.STDOUT, wire.Channel.STDERR]), st.binary()),
        st.tuples(st.just(wire.Channel.EXIT), st.integers(-(2**31), 2**31 - 1).map(
            lambda n: n.to_bytes(4, "big", signed=True))),
    ),
    max_size=6,
)


@given(server_frames, st.lists(st.integers(1, 50), min_size=1))
def test_take_frames_reads_any_chunking(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    data = b"".join(wire.encode_frame(wire.Channel(c), p) for c, p in frames)
    buf = bytearray()
    got: list[tuple[int, bytes]] = []
    pos = 0
    for cut in cuts * (len(data) + 1):
        if pos >= len(data):
            break
        buf += data[pos : pos + cut]
        pos += cut
        got += gpg_shim.take_frames(buf)
    assert got == [(int(c), p) for c, p in frames]
    assert not buf


@given(st.binary(max_size=64))
def test_take_frames_on_garbage_only_returns_or_raises_protocol_error(data: bytes) -> None:
    buf = bytearray(data)
    try:
        for channel, payload in gpg_shim.take_frames(buf):
            assert channel in gpg_shim.SERVER_CHANNELS
            assert len(payload) <= gpg_shim.MAX_PAYLOAD
    except ProtocolError:
        pass


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
    with pytest.raises(ProtocolError, match=message):
        gpg_shim.take_frames(bytearray(header))
    with pytest.raises(ProtocolError):
        wire.FrameDecoder(accept=wire.SERVER_CHANNELS).feed(header)


def test_frames_before_a_bad_header_come_first_and_the_next_call_raises() -> None:
    """Stream order, however the bytes arrived (the C fast path does the same)."""
    good = wire.encode_frame(wire.Channel.STDOUT, b"sig") + wire.encode_error("refused")
    buf = bytearray(good + bytes([0, 0, 0, 0, 0]))
    assert gpg_shim.take_frames(buf) == [(1, b"sig"), (4, b"refused")]
    assert buf == bytes([0, 0, 0, 0, 0])
    with pytest.raises(ProtocolError, match="channel stdin is not allowed here"):
        gpg_shim.take_frames(buf)


def test_exit_status() -> None:
    assert gpg_shim.exit_status(b"\0\0\0\x02") == 2
    assert gpg_shim.exit_status(b"\xff\xff\xff\xff") == -1
    with pytest.raises(ProtocolError, match="expected 4"):
        gpg_shim.exit_status(b"\0")


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))


def test_program_script_is_python_behind_a_shebang() -> None:
    script = gpg_shim.program_script(sys.executable, _root())
    assert script.startswith(f"#!{sys.executable} -IS\n")


def test_program_script_falls_back_to_sh_for_an_awkward_python(tmp_path) -> None:
    """A python path with a space cannot sit on a #! line: /bin/sh execs it instead."""
    odd = tmp_path / "a dir"
    odd.mkdir()
    (odd / "python").symlink_to(sys.executable)
    for python in (str(odd / "python"), "/" + "x" * 130 + "/python"):
        assert gpg_shim.program_script(python, _root()).startswith("#!/bin/sh\n")
    script = tmp_path / "gpg-program"
    script.write_text(gpg_shim.program_script(str(odd / "python"), _root()))
    script.chmod(0o755)
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0 and done.stdout.startswith("gpg-shim "), done.stderr
    unreachable = subprocess.run([str(script), "--status-fd=2", "-bsau", "K"], input="x",
                                 capture_output=True, text=True, timeout=30,
                                 env={"PATH": os.environ["PATH"]})
    assert unreachable.returncode == 125 and "not set" in unreachable.stderr


def test_the_signing_path_imports_no_heavy_module() -> None:
    """What git starts per signature: no socket, json, enum, typing, os or wire."""
    code = (f"import sys; sys.path.insert(0, {_root()!r}); import bin.gpg_shim, "
            "libbroker.gpg_shim; print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=30, check=True)
    loaded = set(done.stdout.split())
    for heavy in ("socket", "json", "enum", "typing", "os", "re", "libbroker.wire",
                  "libbroker.client", "collections"):
        assert heavy not in loaded, heavy
