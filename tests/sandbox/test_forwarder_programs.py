"""bwrap's forwarder's two implementations, side by side: libbroker/native/forwarder.c and
forwarder.py take the same arguments and must do the same (real processes; the
``forwarder_argv`` fixture runs each test with both).  The rlimits' part is
test_forwarder_limits.py's; the sessions run it through tests/launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


class Started:
    """A forwarder waiting for its go byte on a pipe whose write end the test holds."""

    def __init__(self, forwarder: list[str], cmd: list[str], *flags: str,
                 ignore: tuple[int, ...] = ()) -> None:  # fmt: skip
        r, self.control = os.pipe()

        def ignored() -> None:
            for sig in ignore:
                signal.signal(sig, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            [*forwarder, "--control", str(r), *flags, "--", *cmd], pass_fds=(r,),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignored,
        )  # fmt: skip
        os.close(r)

    def send(self, data: bytes) -> None:
        os.write(self.control, data)

    def close(self) -> None:
        if self.control >= 0:
            os.close(self.control)
            self.control = -1

    def end(self, timeout: float = 30) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.close()
        return self.proc.returncode, out, err


def _run(forwarder: list[str], cmd: list[str], *flags: str, word: bytes = b"g",
         ignore: tuple[int, ...] = ()) -> tuple[int, str, str]:  # fmt: skip
    started = Started(forwarder, cmd, *flags, ignore=ignore)
    started.send(word)
    return started.end()


def test_go_runs_the_command_and_its_status_is_the_forwarders(forwarder_argv: list[str]) -> None:
    code, out, _ = _run(forwarder_argv, ["sh", "-c", "echo ran; exit 3"])
    assert (code, out) == (3, "ran\n")


@pytest.mark.parametrize("word", [b"", b"x"])
def test_without_the_go_byte_nothing_runs(forwarder_argv: list[str], word: bytes,
                                          tmp_path: Path) -> None:  # fmt: skip
    marker = tmp_path / "ran"
    started = Started(forwarder_argv, ["touch", str(marker)])
    if word:
        started.send(word)
    started.close()  # end of file: the launcher gave up
    code, _, err = started.end()
    assert code == 125, err
    assert not marker.exists()


def test_a_missing_command_is_127_and_said(forwarder_argv: list[str]) -> None:
    code, _, err = _run(forwarder_argv, ["no-such-command-here"])
    assert code == 127
    assert err == "agent-sandbox: no-such-command-here: command not found\n"


def test_a_command_that_cannot_start_is_126(forwarder_argv: list[str], tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    code, _, err = _run(forwarder_argv, [str(script)])
    assert code == 126
    assert err == f"agent-sandbox: {script}: Permission denied\n"


@pytest.mark.parametrize(
    "args",
    [["--control"], ["--control", "x", "--", "true"], ["--control", "3"],
     ["--control", "3", "--"], ["--bogus", "--", "true"], ["--", "true"]],
)  # fmt: skip
def test_bad_arguments_are_125(forwarder_argv: list[str], args: list[str]) -> None:
    done = subprocess.run([*forwarder_argv, *args], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode == 125
    assert done.stderr.startswith("agent-sandbox: sandbox start: ")
    assert "Traceback" not in done.stderr


def test_a_signal_number_reaches_the_command(forwarder_argv: list[str]) -> None:
    started = Started(forwarder_argv, ["sh", "-c", "echo up; exec sleep 30"], "--own-group")
    started.send(b"g")
    assert started.proc.stdout is not None
    assert started.proc.stdout.readline() == "up\n"
    started.send(bytes([signal.SIGTERM]))
    code, _, _ = started.end()
    assert code == 128 + signal.SIGTERM


def test_the_launcher_gone_kills_the_command(forwarder_argv: list[str]) -> None:
    started = Started(forwarder_argv, ["sh", "-c", "echo up; exec sleep 30"])
    started.send(b"g")
    assert started.proc.stdout is not None
    assert started.proc.stdout.readline() == "up\n"
    t0 = time.monotonic()
    started.close()
    code, _, _ = started.end()
    assert code == 128 + signal.SIGKILL
    assert time.monotonic() - t0 < 10


def test_the_command_gets_no_control_pipe(forwarder_argv: list[str]) -> None:
    """It could read the signals meant for it (the grace's SIGKILL among them)."""
    code, out, err = _run(forwarder_argv, ["sh", "-c", "ls /proc/$$/fd"])
    assert code == 0, err
    assert sorted(int(fd) for fd in out.split()) == [0, 1, 2]


@pytest.mark.parametrize("own_group", [True, False])
def test_the_own_group_flag(forwarder_argv: list[str], own_group: bool) -> None:
    flags = ("--own-group",) if own_group else ()
    code, out, err = _run(forwarder_argv, ["sh", "-c", "ps -o pgid= -p $$; echo $$"], *flags)
    assert code == 0, err
    pgid, pid = (int(word) for word in out.split())
    assert (pgid == pid) is own_group


def _mask(status: str, field: str) -> int:
    line = next(row for row in status.splitlines() if row.startswith(field + ":"))
    return int(line.split()[1], 16)


def test_the_command_starts_with_default_signals(forwarder_argv: list[str]) -> None:
    """What the launcher had ignored for bwrap (a tty's SIGINT and SIGQUIT) and what the
    forwarder itself ignores, the command gets at their defaults, with nothing blocked."""
    code, out, err = _run(forwarder_argv, ["cat", "/proc/self/status"],
                          ignore=(signal.SIGINT, signal.SIGQUIT, signal.SIGHUP))  # fmt: skip
    assert code == 0, err
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ,
                signal.SIGTERM, signal.SIGCHLD):  # fmt: skip
        assert not _mask(out, "SigIgn") & (1 << (sig - 1)), sig
    assert _mask(out, "SigBlk") == 0
