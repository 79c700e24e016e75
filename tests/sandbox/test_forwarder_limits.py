"""bwrap's forwarder sets the session's rlimits on itself before go (real processes).

Under rlimits the launcher's prlimit walk of bwrap's waiting tree cannot promise
the command its limits: nothing orders a prlimit with a fork in flight, and a
child that copied its parent's limits just before, listed just after, keeps the
old ones (a CI run once saw a session's fork bomb and memory hog run unlimited).
The forwarder is the command's parent: it sets them itself, reads them back,
and a limit that does not take ends the sandbox before the command runs.
Both forwarders: forwarder.py and libbroker/native/forwarder.c (``forwarder_argv``).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libbroker.sandbox import cgroups, forwarder

FORWARDER = forwarder.__file__
MiB = 1 << 20


def _limits_of(pid: int | str) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {row[:26].strip(): row[26:47].strip() for row in rows}


def _start(forwarder: list[str], args: list[str],
           cmd: list[str]) -> tuple[subprocess.Popen[str], int]:
    r, w = os.pipe()
    proc = subprocess.Popen(
        [*forwarder, "--control", str(r), *args, "--", *cmd],
        pass_fds=(r,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(r)
    return proc, w


@pytest.mark.parametrize(
    "flag",
    ["6", "6=", "=64", "x=64", "6=-1", "6=6.5", "6=0x40", " 6=64"],
)
def test_a_malformed_rlimit_is_refused(flag: str) -> None:
    with pytest.raises(ValueError, match="--rlimit"):
        forwarder.parse(["--control", "3", "--rlimit", flag, "--", "true"])


def test_the_rlimits_parse_in_order() -> None:
    opts = forwarder.parse(["--control", "3", "--rlimit", "6=64", "--rlimit", "1=0", "--", "x"])
    assert opts.rlimits == [(6, 64), (1, 0)] and opts.cmd == ["x"] and opts.control == 3


@pytest.mark.parametrize("tasks", [8, 63, 64, 65, 4096])
def test_the_command_inherits_what_the_forwarder_set_before_go(
    tasks: int, forwarder_argv: list[str]
) -> None:
    limits = cgroups.inner_rlimits(
        [(resource.RLIMIT_NPROC, 10_000 + tasks), (resource.RLIMIT_DATA, 256 * MiB),
         (resource.RLIMIT_FSIZE, 16 * MiB)],
        tasks,
    )  # fmt: skip
    assert limits[0] == (resource.RLIMIT_NPROC, tasks)  # in bwrap's namespace: the limit itself
    args = [a for which, value in limits for a in ("--rlimit", f"{which}={value}")]
    proc, go = _start(forwarder_argv, args, ["cat", "/proc/self/limits"])
    try:
        # Before go, with nothing of the command running, the forwarder holds them.
        for _ in range(500):  # its interpreter starting
            if _limits_of(proc.pid).get("Max processes") == str(tasks):
                break
            time.sleep(0.01)
        held = _limits_of(proc.pid)
        assert held["Max processes"] == str(tasks), held
        assert held["Max data size"] == str(256 * MiB)
        assert held["Max file size"] == str(16 * MiB)
        os.write(go, b"g")
        out, err = proc.communicate(timeout=30)  # the pipe open: its end is a SIGKILL
    finally:
        os.close(go)
    assert proc.returncode == 0, err
    rows = {row[:26].strip(): row[26:].split() for row in out.splitlines()[1:]}
    assert rows["Max processes"][:2] == [str(tasks), str(tasks)]  # soft and hard
    assert rows["Max data size"][:2] == [str(256 * MiB)] * 2
    assert rows["Max file size"][:2] == [str(16 * MiB)] * 2


@pytest.mark.parametrize("flag", ["99=1", f"6={2**64}", f"2={2**63}"])
def test_a_limit_that_does_not_take_never_runs_the_command(
    flag: str, tmp_path: Path, forwarder_argv: list[str]
) -> None:
    marker = tmp_path / "ran"
    proc, go = _start(forwarder_argv, ["--rlimit", flag], ["touch", str(marker)])
    try:
        _, err = proc.communicate(timeout=30)  # it ends before go
    finally:
        os.close(go)
    assert proc.returncode == 125, err
    assert "cannot set the session's limit" in err and "Traceback" not in err
    assert not marker.exists()


def test_without_rlimits_the_forwarder_loads_no_resource_module() -> None:
    """A session with cgroups (root's, a delegated subtree) pays nothing for this."""
    code = (
        "import sys; sys.argv = ['f', '--control', '0', '--', 'true'];"
        f"sys.path[:0] = [{os.path.dirname(FORWARDER)!r}]; import forwarder;"
        "forwarder.limit_self(forwarder.parse(sys.argv[1:]).rlimits);"
        "print('resource' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "False"
