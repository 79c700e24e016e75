"""The reaper's two implementations, side by side: libbroker/native/reaper.c and
``python3 -m libbroker.sandbox.reaper`` take the same arguments and must do the same.

A harness does what the broker's Landlock backend does: it becomes a child
subreaper, forks the command (``sh -c SCRIPT``), then execs the reaper with
the command's pid and the read end of a control pipe, whose write end the
test holds.  The broker itself runs through test_broker_reaper.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest

import libbroker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))
HARNESS = f"""
import os, sys
sys.path.insert(0, {ROOT!r})
from libbroker.sandbox import reaper
control, group, impl = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
reaper.become_subreaper()
command = os.fork()
if command == 0:
    os.close(control)
    if group == "1":
        os.setsid()
    os.execvp("sh", ["sh", "-c", os.environ["SCRIPT"]])
os.set_inheritable(control, True)
os.execv(impl[0], [*impl, str(command), str(control), group])
"""


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "c":
        return [request.getfixturevalue("native_program")("reaper")]
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from libbroker.sandbox.reaper import main; "
            "sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-S", "-c", code]


class Reaped:
    """A harness run: the reaper process, the control pipe's write end, the escapees' tag."""

    def __init__(self, impl: list[str], script: str, group: bool = True) -> None:
        self.tag = f"reaped-{uuid.uuid4().hex}"
        r, self.control = os.pipe()
        os.set_inheritable(r, True)
        # The marker is put together at run time: only the escapees' command
        # lines hold it whole, not this script's.
        escape = 'setsid sh -c "$a$b" </dev/null >/dev/null 2>&1'
        prologue = (f"a='sleep 300; :'; b=' {self.tag}'; ({escape} &); {escape} & "
                    'until [ $(pgrep -fc "$a$b") -ge 2 ]; do sleep 0.01; done; ')
        env = {**os.environ, "SCRIPT": prologue + script}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HARNESS, str(r), "1" if group else "0", *impl],
            pass_fds=(r,), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        os.close(r)

    def say(self, signum: int) -> None:
        os.write(self.control, bytes([signum]))

    def hang_up(self) -> None:
        if self.control >= 0:
            os.close(self.control)
            self.control = -1

    def end(self) -> tuple[int, bytes, bytes]:
        out, err = self.proc.communicate(timeout=60)
        self.hang_up()
        return self.proc.returncode, out, err

    @property
    def marker(self) -> str:
        """The escapees' command line: nothing else holds it whole."""
        return f"sleep 300; : {self.tag}"


def test_the_command_s_status_and_nothing_left(impl: list[str], tools: Any) -> None:
    run = Reaped(impl, "exit 3")
    assert run.end()[0] == 3
    assert tools.gone(run.marker) == []


def test_a_signal_death_is_passed_on(impl: list[str], tools: Any) -> None:
    run = Reaped(impl, "kill -TERM $$")
    assert run.end()[0] == -signal.SIGTERM
    assert tools.gone(run.marker) == []


@pytest.mark.parametrize("group", [True, False])
def test_signals_from_the_control_pipe_reach_the_command(
    impl: list[str], group: bool, tools: Any
) -> None:
    run = Reaped(impl, "trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done", group)
    assert run.proc.stdout is not None
    assert run.proc.stdout.readline() == b"ready\n"
    run.say(signal.SIGTERM)
    assert run.end()[0] == 7
    assert tools.gone(run.marker) == []


def test_end_of_file_on_the_control_pipe_kills_everything(impl: list[str], tools: Any) -> None:
    run = Reaped(impl, "echo ready; sleep 300")
    assert run.proc.stdout is not None
    assert run.proc.stdout.readline() == b"ready\n"
    run.hang_up()
    assert run.end()[0] == -signal.SIGKILL
    assert tools.gone(run.marker) == []


@pytest.mark.parametrize("args", [[], ["1", "2"], ["x", "3", "1"], ["1", "3", "2"]])
def test_bad_arguments_are_refused(impl: list[str], args: list[str]) -> None:
    done = subprocess.run([*impl, *args], capture_output=True, timeout=30, check=False)
    assert done.returncode == 125
    assert b"usage: reaper COMMAND CONTROL_FD GROUP(0|1)" in done.stderr
