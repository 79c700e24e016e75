"""Nothing a brokered command starts outlives it: setsid(), double forks, a dead server.

bwrap's PID namespace ends everything with the command; under Landlock the
reaper (libbroker.sandbox.reaper) does.  Each test runs on both backends unless it is
about the reaper itself.  Signal forwarding through the reaper is
test_broker_pipelines.py's test_signals_are_forwarded.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.sandbox import pidns, reaper


def _tag() -> str:
    return f"reaper-test-{uuid.uuid4().hex}"


def _script(workdir: str | Path, tag: str, then: str) -> str:
    """A script in ``workdir`` that leaves two processes behind, both out of its
    process group (setsid; setsid after a double fork), then runs ``then``.

    Returns its name.  A file, not ``sh -c``: only the two escapees' command
    lines carry ``tag``.
    """
    name = f"escape-{uuid.uuid4().hex}.sh"
    marker = _marker(tag)
    Path(workdir, name).write_text(
        f"escape() {{ setsid sh -c '{marker}' </dev/null >/dev/null 2>&1; }}\n"
        "escape &\n"
        "(escape &)\n"
        f"until [ \"$(pgrep -fc '{marker}')\" -ge 2 ]; do sleep 0.01; done\n"
        f"{then}\n"
    )
    return name


def _marker(tag: str) -> str:
    """The escapees' own command line: nothing else carries it."""
    return f"sleep 300; : {tag}"


def _settles_at(tools: Any, marker: str, count: int, within: float = 5.0) -> bool:
    """Whether exactly ``count`` processes carry ``marker`` within ``within`` s: for a
    moment setsid(1)'s own process, between its fork and exec, carries it too."""
    deadline = time.monotonic() + within
    while len(tools.running(marker)) != count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_what_a_command_leaves_running_ends_with_it(broker: Any, tools: Any) -> None:
    tag = _tag()
    done = broker.sh(f"broker-client -- sh {_script(broker.workdir, tag, 'exit 3')}")
    assert done.returncode == 3, done.stderr
    assert tools.gone(_marker(tag)) == []


def test_a_client_that_goes_away_takes_the_escaped_processes_too(
    broker: Any, tools: Any
) -> None:
    tag = _tag()
    script = _script(broker.workdir, tag, "echo ready; sleep 300")
    client = subprocess.Popen(
        ["broker-client", "--", "sh", script], cwd=broker.workdir, env=broker.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert client.stdout is not None
    assert client.stdout.readline() == b"ready\n"
    assert _settles_at(tools, _marker(tag), 2)
    client.kill()
    client.wait(timeout=30)
    assert tools.gone(_marker(tag)) == []


@pytest.mark.parametrize("backend", ["nono", "bwrap"])
def test_a_killed_server_takes_its_commands_along(tools: Any, tmp_path: Path, backend: str) -> None:
    work = tmp_path / "w"
    work.mkdir()
    sock = str(tmp_path / "s")
    server = tools.start_server(backend, str(work), sock)
    tag = _tag()
    env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
    script = _script(work, tag, "echo ready; sleep 300")
    client = subprocess.Popen(
        [tools.client, "--", "sh", script], cwd=work, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == b"ready\n"
        assert _settles_at(tools, _marker(tag), 2)
        server.kill()  # no clean-up of its own: the reaper sees its pipe close
        server.wait(timeout=30)
        assert tools.gone(_marker(tag)) == []
    finally:
        client.kill()
        client.wait(timeout=30)
        tools.stop_server(server)


def test_the_command_cannot_signal_its_reaper(tools: Any, tmp_path: Path) -> None:
    """Landlock's signal scoping: the reaper is outside the sandbox."""
    work = tmp_path / "w"
    work.mkdir()
    sock = str(tmp_path / "s")
    server = tools.start_server("nono", str(work), sock)
    try:
        env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
        done = subprocess.run(
            [tools.client, "--", "sh", "-c", "kill -9 $PPID && echo killed; echo still here"],
            cwd=work, env=env, capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"still here\n"
        assert b"not permitted" in done.stderr
    finally:
        tools.stop_server(server)


def test_statuses_come_through_the_reaper(broker: Any) -> None:
    for script, status in [("exit 0", 0), ("exit 42", 42), ("kill -TERM $$", 128 + 15),
                           ("kill -KILL $$", 128 + 9)]:
        done = broker.sh(f"broker-client -- sh -c '{script}'")
        assert done.returncode == status, (script, done.stderr)


# --- the pure part -------------------------------------------------------------------


@given(st.dictionaries(st.integers(2, 40), st.integers(1, 40), max_size=40))
def test_descendants_are_exactly_those_whose_parents_lead_to_the_root(
    parents: dict[int, int],
) -> None:
    found = reaper.descendants(1, parents)
    assert len(found) == len(set(found))
    for pid in parents:
        chain, seen = pid, set()
        while chain in parents and chain not in seen and chain != 1:
            seen.add(chain)
            chain = parents[chain]
        assert (pid in found) == (chain == 1)
    for i, pid in enumerate(found):  # parents first
        assert parents[pid] == 1 or parents[pid] in found[:i]


def test_parent_of_reads_past_a_name_with_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "a) 9 9 ("
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        assert reaper.parent_of(proc.pid) == os.getpid()
    finally:
        proc.kill()
        proc.wait()
    assert reaper.parent_of(proc.pid) is None


def test_the_landlock_reaper_is_the_small_program_when_built(tools: Any, tmp_path: Path) -> None:
    """Not a copy-on-write twin of the server for as long as the command runs."""
    from libbroker.native import built

    work = tmp_path / "w"
    work.mkdir()
    sock = str(tmp_path / "s")
    server = tools.start_server("nono", str(work), sock)
    duration = f"300.{uuid.uuid4().int % 10**6:06d}"  # names the command among all processes
    env = dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)
    client = subprocess.Popen(
        [tools.client, "--", "sh", "-c", f"echo ready; exec sleep {duration}"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == b"ready\n"
        found = tools.started(f"sleep\0{duration}\0")  # "ready" comes just before the exec
        assert len(found) == 1
        command = found[0]
        reapers = [reaper.parent_of(command)]
        assert reapers[0] is not None and reapers[0] != server.pid
        if pidns.supported():  # the init of the command's PID namespace, below the outer reaper
            reapers.append(reaper.parent_of(reapers[0]))
        assert reaper.parent_of(reapers[-1]) == server.pid
        small = built("reaper") or os.path.realpath(os.readlink(f"/proc/{server.pid}/exe"))
        assert [os.readlink(f"/proc/{pid}/exe") for pid in reapers] == [small] * len(reapers)
    finally:
        client.kill()
        client.wait(timeout=30)
        tools.stop_server(server)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""
