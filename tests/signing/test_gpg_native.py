"""gpg-shim's C fast path against a scripted broker, side by side with the Python shim.

The fast path claims to be the Python gpg-shim for git's one signing form,
byte for byte on the wire, with the same messages and exit statuses, and to
hand everything else to the Python shim beside it.  Each test here runs both
programs on the same input against the same scripted broker and compares
what each sent and printed.  The real git/gpg/broker run is in
test_signing_e2e.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import libbroker
from libbroker import wire
from libbroker.native import FULL_SHIM, install_gpg_program
from libbroker.signing import shim as gpg_shim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))
SIGNED = (
    wire.encode_frame(wire.Channel.STDOUT, b"-----BEGIN PGP SIGNATURE-----\n...\n")
    + wire.encode_frame(wire.Channel.STDERR, b"[GNUPG:] SIG_CREATED D 22 8 00 1 X\n")
    + wire.encode_exit(0)
)


class Layout(NamedTuple):
    fast: str  # the C program, as the launcher links it: <dir>/gpg-shim
    full: str  # the Python gpg-shim it hands over to: <dir>/python/gpg-shim


@pytest.fixture(scope="module")
def layout(native_gpg_shim: str) -> Iterator[Layout]:
    """The session's gpg.program layout, in a private directory."""
    root = Path(tempfile.mkdtemp(prefix="gsn-", dir="/tmp"))
    try:
        fast = root / "gpg-shim"
        install_gpg_program(str(fast), sys.executable, ROOT, native_gpg_shim)
        yield Layout(str(fast), str(root / FULL_SHIM))
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Broker:
    """One connection's worth of a broker that answers with scripted bytes.

    It reads the client's frames up to the empty stdin frame (end of the
    payload), then sends ``answer`` and closes.
    """

    def __init__(self, path: str, answer: bytes) -> None:
        self.path = path
        self.answer = answer
        self.received = bytearray()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            decoder = wire.FrameDecoder(accept=wire.CLIENT_CHANNELS)
            done = False
            while not done:
                data = conn.recv(1 << 16)
                if not data:
                    break
                self.received += data
                for f in decoder.feed(data):
                    done = done or (f.channel == wire.Channel.STDIN and not f.payload)
            with contextlib.suppress(OSError):
                conn.sendall(self.answer)

    def close(self) -> None:
        # shutdown wakes an accept() still waiting (close alone does not, on Linux)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=10)


class Run(NamedTuple):
    status: int
    stdout: bytes
    stderr: bytes
    sent: bytes


def run(program: str, args: list[str], *, answer: bytes | None = SIGNED, payload: bytes = b"tree\n",
        cwd: str = "/", env: dict[str, str] | None = None) -> Run:
    """``program args`` with ``payload`` on stdin, against a broker that answers ``answer``.

    ``answer=None``: no broker at all (AGENT_SANDBOX_BROKER_SOCKET unset).
    """
    sockdir = tempfile.mkdtemp(prefix="gsn-b-", dir="/tmp")
    broker = None
    full_env = {"PATH": os.environ["PATH"], "LANG": "C", **(env or {})}
    if answer is not None:
        broker = Broker(os.path.join(sockdir, "b.sock"), answer)
        full_env.setdefault("AGENT_SANDBOX_BROKER_SOCKET", broker.path)
    try:
        done = subprocess.run([program, *args], input=payload, capture_output=True, cwd=cwd,
                              env=full_env, timeout=60, check=False)
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(sockdir, ignore_errors=True)
    sent = bytes(broker.received) if broker is not None else b""
    return Run(done.returncode, done.stdout, done.stderr, sent)


def both(layout: Layout, args: list[str], **kw: object) -> tuple[Run, Run]:
    """The same run through the fast path and through the Python shim."""
    return run(layout.fast, args, **kw), run(layout.full, args, **kw)  # type: ignore[arg-type]


SIGN = ["--status-fd=2", "-bsau"]


# --- the signing form: the same bytes on the wire and out ------------------------


_ascii_key = st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=127), min_size=1,
                     max_size=40)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=_ascii_key, payload=st.binary(max_size=3000))
def test_the_wire_bytes_are_the_python_shims(layout: Layout, key: str, payload: bytes) -> None:
    fast = run(layout.fast, [*SIGN, key], payload=payload)
    assert fast.sent == gpg_shim.sign_frames(key, "/", payload)
    assert (fast.status, fast.stdout) == (0, b"-----BEGIN PGP SIGNATURE-----\n...\n")
    assert fast.stderr == b"[GNUPG:] SIG_CREATED D 22 8 00 1 X\n"


def test_a_payload_over_one_frame_is_split_as_the_python_shim_splits_it(
    layout: Layout, tmp_path: Path
) -> None:
    payload = os.urandom(wire.MAX_PAYLOAD * 2 + 3)
    fast, full = both(layout, [*SIGN, "KEY"], payload=payload, cwd=str(tmp_path))
    assert fast.sent == full.sent == gpg_shim.sign_frames("KEY", str(tmp_path), payload)
    assert fast[:3] == full[:3]


def test_a_payload_over_64_mib_is_refused_like_the_python_shim(layout: Layout) -> None:
    payload = b"x" * (gpg_shim.MAX_SIGN_PAYLOAD + 1)
    fast, full = both(layout, [*SIGN, "KEY"], payload=payload)
    assert fast[:3] == full[:3]
    assert fast.status == 2 and b"exceeds 64 MiB" in fast.stderr


# --- whatever the broker answers: the same status and message -----------------------


def _frame(channel: int, payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">BI", channel, len(payload) if length is None else length) + payload


ANSWERS = {
    "refused": wire.encode_error("no key FOO on the list"),
    "gpg failed": wire.encode_frame(wire.Channel.STDERR, b"gpg: skipped: No secret key\n")
    + wire.encode_exit(2),
    "negative status": wire.encode_exit(-1),
    "status over 255": wire.encode_exit(300),
    "a whole MiB of stdout": _frame(1, b"s" * wire.MAX_PAYLOAD) + wire.encode_exit(0),
    "many small frames": b"".join(_frame(c, b"%d\n" % i) for i in range(500) for c in (1, 2))
    + wire.encode_exit(0),
    "unknown channel": _frame(9, b"x"),
    "a client channel": _frame(0, b"x"),
    "the request channel": _frame(5, b"{}"),
    "a huge length": _frame(1, b"", length=0xFFFFFFFF),
    "one byte over the limit": _frame(1, b"", length=wire.MAX_PAYLOAD + 1),
    "a short exit frame": _frame(3, b"\0\0\0"),
    "a long exit frame": _frame(3, b"\0\0\0\0\0"),
    "closed mid-header": b"\x01\x00",
    "closed mid-payload": _frame(1, b"abc", length=10),
    "closed without an exit frame": wire.encode_frame(wire.Channel.STDOUT, b"sig"),
    "nothing at all": b"",
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_every_answer_ends_as_in_the_python_shim(layout: Layout, name: str) -> None:
    fast, full = both(layout, [*SIGN, "KEY"], answer=ANSWERS[name])
    assert fast.sent == full.sent
    assert (fast.status, fast.stdout, fast.stderr) == (full.status, full.stdout, full.stderr)
    assert fast.status in {0, 1, 2, 125, 255, 300 & 0xFF}, fast


# --- everything else: handed to the Python shim ---------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["-bsau", "KEY"],  # no status fd: the Python shim signs
        ["--status-fd=2", "-bsau", ""],  # usage error
        ["--status-fd=2", "-b", "-s", "-a", "-u", "KEY"],
        ["--status-fd=7", "-bsau", "KEY"],  # a status fd that is not open
        ["--status-fd=2", "-bsau", "KEY", "extra"],
        ["--status-fd=2", "--clearsign", "-u", "KEY"],
        ["--status-fd=2", "-bsau", "J\u00f6rg <j@example.test>"],  # not ASCII: Python quotes it
    ],
)
def test_other_calls_are_the_python_shims(layout: Layout, args: list[str]) -> None:
    fast, full = both(layout, args)
    assert fast == full


def test_an_unset_socket_and_an_unreachable_broker_are_reported_by_the_python_shim(
    layout: Layout, tmp_path: Path
) -> None:
    fast, full = both(layout, [*SIGN, "KEY"], answer=None)
    assert fast == full
    assert fast.status == 125 and b"AGENT_SANDBOX_BROKER_SOCKET is not set" in fast.stderr
    env = {"AGENT_SANDBOX_BROKER_SOCKET": str(tmp_path / "nobody.sock")}
    fast, full = both(layout, [*SIGN, "KEY"], answer=None, env=env)
    assert fast == full
    assert fast.status == 125 and b"does not exist" in fast.stderr


def test_a_working_directory_that_is_not_ascii_is_quoted_by_the_python_shim(
    layout: Layout, tmp_path: Path
) -> None:
    where = tmp_path / "d\u00e9p\u00f4t"
    where.mkdir()
    fast, full = both(layout, [*SIGN, "KEY"], cwd=str(where))
    assert fast == full
    assert fast.sent == gpg_shim.sign_frames("KEY", str(where), b"tree\n")


def test_verification_goes_to_the_python_shim_and_the_local_gpg(layout: Layout,
                                                                tmp_path: Path) -> None:
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed")
    sig = tmp_path / "sig"
    sig.write_text("not a signature\n")
    env = {"GNUPGHOME": str(tmp_path)}
    fast, full = both(layout, ["--status-fd=1", "--verify", str(sig), "-"], answer=None, env=env)
    assert (fast.status, fast.stdout) == (full.status, full.stdout)
    assert fast.status != 0 and b"gpg:" in fast.stderr  # the local gpg answered


def test_without_the_python_shim_beside_it_the_fast_path_says_so(layout: Layout,
                                                                 tmp_path: Path) -> None:
    lonely = tmp_path / "gpg-shim"
    lonely.symlink_to(os.path.realpath(layout.fast))
    done = run(str(lonely), ["--verify", "x"], answer=None)
    assert done.status == 127
    assert done.stderr.startswith(b"gpg-shim: cannot run the full gpg-shim ")


def test_run_by_a_bare_name_it_refuses_to_guess(layout: Layout, tmp_path: Path) -> None:
    (tmp_path / "fastshim").symlink_to(os.path.realpath(layout.fast))
    done = subprocess.run(["fastshim", "--verify", "x"], capture_output=True, timeout=30,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False)
    assert done.returncode == 127
    assert b"run this program by its path" in done.stderr


_frames = st.lists(
    st.tuples(st.integers(0, 10), st.binary(max_size=40)).map(lambda f: _frame(f[0], f[1])),
    max_size=6,
).map(b"".join)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=st.one_of(_frames, st.binary(max_size=64), _frames.map(lambda b: b[:-1])))
def test_any_answer_ends_as_in_the_python_shim(layout: Layout, answer: bytes) -> None:
    """Differential fuzzing: random frames, random bytes, frames cut short.

    Both act on frames in stream order.  A broker's error message is written
    as its bytes by the C program and as decoded text (invalid UTF-8
    replaced) by the Python shim: compared after the same decoding.
    """
    fast, full = both(layout, [*SIGN, "KEY"], answer=answer)
    assert (fast.status, fast.stdout) == (full.status, full.stdout)
    assert fast.stderr.decode("utf-8", "replace") == full.stderr.decode("utf-8", "replace")
    if fast.status == 125:
        # gpg's stderr frames may come first (not always ending in a newline):
        # the shim's own message ends the output.
        assert re.search(rb"gpg-shim: [^\n]*broker[^\n]*\n\Z", fast.stderr), fast.stderr


def test_in_a_landlock_session_the_fast_path_signs_through_the_door(
    layout: Layout, tmp_path: Path
) -> None:
    """No unix socket may be made there (seccomp): the door relays a loopback port to
    the broker.  Alone, without the Python shim beside it, any fallback would be a 127."""
    from libbroker.launcher.door import Door

    lonely = tmp_path / "gpg-shim"
    lonely.symlink_to(os.path.realpath(layout.fast))
    broker = Broker(str(tmp_path / "b.sock"), SIGNED)
    door = Door(broker.path)
    env = {
        "PATH": os.environ["PATH"],
        "AGENT_SANDBOX_BROKER_SOCKET": broker.path,
        "AGENT_SANDBOX_BROKER_DOOR": str(door.port),
    }
    try:
        done = subprocess.run([str(lonely), *SIGN, "KEY"], input=b"tree\n", capture_output=True,
                              env=env, timeout=30, check=False)
        assert (done.returncode, done.stdout) == (0, b"-----BEGIN PGP SIGNATURE-----\n...\n")
        assert bytes(broker.received) == gpg_shim.sign_frames("KEY", os.getcwd(), b"tree\n")
        # a door that does not answer: the fast path hands over (and, alone, says so)
        door.close()
        done = subprocess.run([str(lonely), *SIGN, "KEY"], input=b"tree\n", capture_output=True,
                              env=env, timeout=30, check=False)
        assert done.returncode == 127 and b"cannot run the full gpg-shim" in done.stderr
    finally:
        door.close()
        broker.close()
