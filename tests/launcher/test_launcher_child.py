"""The light spawn path (child.py, boot.py): arguments arrive, nothing outlives the launcher.

A stand-in "launcher" (a Python process that spawns the way prestart does)
starts a deferred-boot child, and the tests kill it with SIGKILL: the child
must end by itself (PR_SET_PDEATHSIG set in its boot).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from libbroker.launcher import boot, child

# A deferred-boot server that reports its argv and descriptors, then sleeps.
_FAKE = """import json, os, sys, time
def main():
    fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
    print(json.dumps({"argv": sys.argv, "pid": os.getpid(), "fds": fds}), flush=True)
    time.sleep(600)
"""

# The stand-in launcher: spawns the fake server as prestart spawns the
# servers, sends its arguments, prints the server's report, then waits.
_LAUNCHER = """import os, sys
sys.path[:0] = [{fakes!r}]
from libbroker.launcher import boot, child
leak = os.open(os.devnull, os.O_RDONLY)
os.set_inheritable(leak, True)  # an inherited descriptor the child must not get
argv = boot.deferred_python_argv("fake-server", "fake_server", ("json",))
argv[argv.index("-c") + 1] = argv[argv.index("-c") + 1].replace(
    "sys.path[:0] = [", "sys.path[:0] = [{fakes!r}, ", 1)
c = child.spawn("fake-server", argv, stdin_pipe=True)
c.send_args(boot.encode_args({args!r}))
assert c.proc.stdout is not None
line = b""
while not line.endswith(b"\\n"):
    chunk = os.read(c.proc.stdout.fileno(), 4096)
    if not chunk:
        break
    line += chunk
sys.stdout.write(line.decode())
sys.stdout.flush()
os.read(0, 1)  # until the test ends us
"""


def _gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether ``pid`` is gone (or a zombie nobody will run again) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _launcher(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    (tmp_path / "fake_server.py").write_text(_FAKE)
    code = _LAUNCHER.format(fakes=str(tmp_path), args=args)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the stand-in launcher ended before its child reported"
    return proc, json.loads(line)


def test_arguments_reach_the_server_and_it_dies_with_the_launcher(tmp_path: Path) -> None:
    args = ["--listen=127.0.0.1:0", "", "with space", "ünï"]
    proc, report = _launcher(tmp_path, args)
    pid = report["pid"]
    assert isinstance(pid, int)
    try:
        assert report["argv"] == ["fake-server", *args]
        # Only stdio (stdin is /dev/null by now): the launcher's inheritable fd stayed home.
        assert [fd for fd in report["fds"] if fd > 2] == [3]  # type: ignore[attr-defined]
        # (3 is listdir's own.)
        assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        proc.kill()  # SIGKILL: no cleanup code of the launcher runs
        proc.wait(30)
        assert _gone(pid), "the server outlived its launcher"
    finally:
        if not _gone(pid, 0):
            os.kill(pid, signal.SIGKILL)


def test_a_child_whose_launcher_is_already_gone_exits_at_once() -> None:
    code = boot._DIE_WITH.format(sig=15, launcher=1) + "import time; time.sleep(600)\n"
    # Its parent is this test, not pid 1: as if the launcher died before the prctl.
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], timeout=60, check=False)
    assert done.returncode == 0


def test_spawn_pipes_statuses_and_missing_programs(tmp_path: Path) -> None:
    c = child.spawn("sh", ["sh", "-c", "echo out; echo err >&2; exit 7"])
    try:
        assert c.wait(30)
        assert c.proc.returncode == 7 and c.exited()
        assert c.proc.stdout is not None and c.proc.stderr is not None
        assert c.proc.stdout.read() == b"out\n" and c.proc.stderr.read() == b"err\n"
    finally:
        c.close()
    c = child.spawn("sleep", ["sleep", "60"], pipes=False)
    try:
        c.send(signal.SIGTERM)
        assert c.wait(30) and c.proc.returncode == -signal.SIGTERM
    finally:
        c.close()
    # Python ignores SIGPIPE; its children get SIGPIPE and SIGXFSZ back at their
    # defaults, as subprocess leaves them (bits 12 and 24 of SigIgn).
    c = child.spawn("grep", ["grep", "SigIgn", "/proc/self/status"])
    try:
        assert c.wait(30) and c.proc.stdout is not None
        ignored = int(c.proc.stdout.read().split()[1], 16)
        assert not ignored & (1 << 12) and not ignored & (1 << 24)
    finally:
        c.close()
    # The program is looked up on the child's PATH, as subprocess does.
    (tmp_path / "only-here").write_text("#!/bin/sh\nexit 5\n")
    (tmp_path / "only-here").chmod(0o755)
    c = child.spawn("x", ["only-here"], env={"PATH": str(tmp_path)}, pipes=False)
    try:
        assert c.wait(30) and c.proc.returncode == 5
    finally:
        c.close()
    import pytest

    from libbroker.errors import LaunchError

    with pytest.raises(LaunchError, match="cannot start nothing: No such file"):
        child.spawn("nothing", ["no-such-program-here"], env={"PATH": str(tmp_path)})
