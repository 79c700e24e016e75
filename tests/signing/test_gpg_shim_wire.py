"""gpg-shim speaks the wire format through libbroker.wire; its signing path stays light."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

import libbroker
from libbroker import native, wire
from libbroker.signing import shim as gpg_shim


@given(st.text(min_size=1), st.text())
def test_the_sign_request_is_what_wire_parses(key: str, cwd: str) -> None:
    cwd = "/" + cwd
    [request] = wire.FrameDecoder().feed(gpg_shim.sign_frames(key, cwd, b"")[:-5])
    expected = wire.Request(("gpg", "--status-fd=2", "-bsau", key), cwd, True, "sign", key)
    assert request == (wire.Channel.REQUEST, expected.to_json())
    if "\0" not in cwd + key:  # NUL is refused in argv and cwd (wire.parse_request)
        assert wire.parse_request(request.payload) == expected


@given(st.binary(max_size=3000), st.integers(1, 4))
def test_sign_frames_decode_to_the_payload(payload: bytes, split: int) -> None:
    data = gpg_shim.sign_frames("KEY", "/w", payload)
    frames = wire.FrameDecoder(accept=wire.CLIENT_CHANNELS).feed(data)
    assert frames[0].channel == wire.Channel.REQUEST
    assert [f.channel for f in frames[1:]] == [wire.Channel.STDIN] * (len(frames) - 1)
    assert b"".join(f.payload for f in frames[1:]) == payload
    assert frames[-1].payload == b""


def test_a_big_payload_is_split_at_the_frame_limit() -> None:
    payload = os.urandom(wire.MAX_PAYLOAD * 2 + 7)
    frames = wire.FrameDecoder().feed(gpg_shim.sign_frames("K", "/", payload))
    assert [len(f.payload) for f in frames[1:]] == [wire.MAX_PAYLOAD, wire.MAX_PAYLOAD, 7, 0]


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))


def test_program_script_is_python_behind_a_shebang() -> None:
    script = native.program_script(sys.executable, _root())
    assert script.startswith(f"#!{sys.executable} -IS\n")


def test_program_script_falls_back_to_sh_for_an_awkward_python(tmp_path) -> None:
    """A python path with a space cannot sit on a #! line: /bin/sh execs it instead."""
    odd = tmp_path / "a dir"
    odd.mkdir()
    (odd / "python").symlink_to(sys.executable)
    for python in (str(odd / "python"), "/" + "x" * 130 + "/python"):
        assert native.program_script(python, _root()).startswith("#!/bin/sh\n")
    script = tmp_path / "gpg-program"
    script.write_text(native.program_script(str(odd / "python"), _root()))
    script.chmod(0o755)
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0 and done.stdout.startswith("gpg-shim "), done.stderr
    unreachable = subprocess.run([str(script), "--status-fd=2", "-bsau", "K"], input="x",
                                 capture_output=True, text=True, timeout=30,
                                 env={"PATH": os.environ["PATH"]})
    assert unreachable.returncode == 125 and "not set" in unreachable.stderr


def test_the_signing_path_imports_no_heavy_module() -> None:
    """What git starts per signature: no socket, json, enum, typing or os (wire is cheap)."""
    code = (f"import sys; sys.path.insert(0, {_root()!r}); import bin.gpg_shim, "
            "libbroker.signing.shim; print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=30, check=True)
    loaded = set(done.stdout.split())
    assert "libbroker.wire" in loaded  # the one decoder, on this path too
    for heavy in ("socket", "json", "enum", "typing", "os", "re", "struct", "mmap",
                  "libbroker.broker.client", "collections"):
        assert heavy not in loaded, heavy
