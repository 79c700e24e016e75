"""broker-client where no unix socket can be made: 125 and what to do, not 70 (issue 15 item 4).

A command the broker runs under Landlock has a seccomp filter that refuses
``socket(AF_UNIX)`` with EACCES; broker-client there used to die with
``internal error: PermissionError`` (70).  The filter is loaded here by a tiny
self-contained BPF program before exec'ing the real broker-client.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Refuse socket(AF_UNIX, ...) with EACCES on x86_64; allow everything else.
_LOADER = textwrap.dedent("""
    import ctypes, os, struct, sys
    def insn(code, jt, jf, k): return struct.pack("<HBBI", code, jt, jf, k)
    LD, JEQ, RET = 0x20, 0x15, 0x06
    prog = b"".join([
        insn(LD, 0, 0, 4), insn(JEQ, 1, 0, 0xC000003E), insn(RET, 0, 0, 0x7FFF0000),
        insn(LD, 0, 0, 0), insn(JEQ, 0, 3, 41),
        insn(LD, 0, 0, 16), insn(JEQ, 0, 1, 1),
        insn(RET, 0, 0, 0x00050000 | 13), insn(RET, 0, 0, 0x7FFF0000),
    ])
    class F(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
    assert libc.prctl(22, 2, ctypes.byref(F(len(prog) // 8, prog)), 0, 0) == 0
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c",
             "import sys; sys.path.insert(0, sys.argv[1]); sys.argv[0] = 'broker-client'; "
             "del sys.argv[1]; from bin.broker_client import main; main()", *sys.argv[1:]])
""")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the BPF program is x86_64's")
def test_no_unix_socket_gives_125_and_what_to_do(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "AGENT_SANDBOX_BROKER_SOCKET": str(tmp_path / "b.sock")}
    done = subprocess.run([sys.executable, "-I", "-c", _LOADER, str(ROOT), "--", "true"],
                          capture_output=True, text=True, env=env, timeout=30, check=False)
    assert done.returncode == 125, done
    assert "internal error" not in done.stderr
    line = done.stderr.strip()
    assert line.startswith("broker-client: cannot create a unix socket"), line
    assert "Permission denied" in line and "session's own shell" in line
    assert len(done.stderr.splitlines()) == 1


def test_dial_maps_every_socket_failure_to_broker_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import _socket

    from libbroker.broker import dial
    from libbroker.errors import BrokerUnavailable

    for exc in (PermissionError(13, "Permission denied"), OSError(24, "Too many open files")):
        def refuse(*_a: object, _exc: OSError = exc) -> object:
            raise _exc

        monkeypatch.setattr(_socket, "socket", refuse)
        with pytest.raises(BrokerUnavailable) as caught:
            dial.dial("/x.sock")
        assert exc.strerror is not None and exc.strerror in str(caught.value)
        assert caught.value.exit_code == 125
