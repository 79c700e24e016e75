"""broker-client and broker-server end to end, with each sandbox backend.

Real console scripts, a real unix socket, real sandboxes, shell pipelines.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
import time

from libbroker.broker import client
from libbroker.wire import Request


def test_sort_in_a_pipeline(broker) -> None:
    done = broker.sh("printf 'b\\na\\n' | broker-client -- sort | cat")
    assert (done.returncode, done.stdout) == (0, b"a\nb\n"), done.stderr


def test_stdout_and_stderr_stay_separate(broker) -> None:
    out = broker.sh("broker-client -- sh -c 'echo out; echo err >&2' 2>/dev/null")
    assert out.stdout == b"out\n" and out.stderr == b""
    err = broker.sh("broker-client -- sh -c 'echo out; echo err >&2' >/dev/null")
    assert err.stdout == b"" and err.stderr == b"err\n"


def test_exit_statuses_follow_the_shell_rule(broker) -> None:
    with open(os.path.join(broker.workdir, "plain.txt"), "w") as fh:
        fh.write("not a program\n")
    done = broker.sh(
        "broker-client -- true; echo $?;"
        "broker-client -- sh -c 'exit 3'; echo $?;"
        "broker-client -- no-such-command-xyz; echo $?;"
        "broker-client -- ./plain.txt; echo $?;"
        "broker-client -- sh -c 'kill -9 $$'; echo $?"
    )
    assert done.stdout.split() == [b"0", b"3", b"127", b"126", b"137"], done.stderr
    assert b"no-such-command-xyz" in done.stderr


def test_ten_mib_both_ways_intact(broker) -> None:
    data = os.urandom(10 << 20)
    with open(os.path.join(broker.workdir, "blob"), "wb") as fh:
        fh.write(data)
    digest = hashlib.sha256(data).hexdigest().encode()
    out = broker.sh("broker-client -n -- cat blob | sha256sum")
    assert out.stdout.split()[0] == digest
    into = broker.sh("cat blob | broker-client -- sha256sum")
    assert into.stdout.split()[0] == digest


def test_no_stdin_flag(broker) -> None:
    done = broker.sh("echo hello | broker-client -n -- cat; echo rc=$?")
    assert done.stdout == b"rc=0\n"


def test_stdout_closed_downstream_gives_141(broker) -> None:
    done = broker.sh("broker-client -- yes | head -1; echo ${PIPESTATUS[0]}")
    assert done.stdout == b"y\n141\n", done.stderr


def test_tail_f_into_grep_m1_ends_when_grep_ends(broker) -> None:
    done = broker.sh(
        ": > log; (sleep 0.3; echo y >> log) & "
        "tail -f log | broker-client -- grep -m1 y; echo grep=$?",
        timeout=20,
    )
    assert done.stdout == b"y\ngrep=0\n", done.stderr


def test_signals_are_forwarded(broker) -> None:
    proc = subprocess.Popen(
        ["broker-client", "--", "sh", "-c",
         "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"],
        cwd=broker.workdir, env=broker.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, out) == (7, b"got-term\n"), err


def test_command_dies_with_its_client(broker, tools) -> None:
    marker = f"61.{os.getpid()}{len(broker.backend)}"
    proc = subprocess.Popen(
        ["broker-client", "--", "sh", "-c", f"echo started; sleep {marker}; :"],
        cwd=broker.workdir, env=broker.env, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    assert tools.started(marker)
    proc.kill()
    proc.wait()
    assert tools.gone(marker) == []


def test_fifty_concurrent_clients(broker) -> None:
    results: dict[int, tuple[int, bytes]] = {}

    def one(i: int) -> None:
        r, w = os.pipe()
        req = Request(("sh", "-c", "sleep 0.2; echo $0", str(i)), broker.workdir, with_stdin=False)
        status = client.call(req, path=broker.socket, stdin_fd=None, stdout_fd=w,
                             forward_signals=())  # fmt: skip
        os.close(w)
        results[i] = (status, os.read(r, 100))
        os.close(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: (0, f"{i}\n".encode()) for i in range(50)}


def test_cwd_outside_the_workdir_is_refused(broker) -> None:
    os.symlink("/etc", os.path.join(broker.workdir, "escape"))
    for flag in ("-C /", "-C escape", "-C .."):
        done = broker.sh(f"broker-client {flag} -- true")
        assert done.returncode == 125
        assert b"outside the workdir" in done.stderr
    with open(broker.audit) as fh:
        entries = [json.loads(line) for line in fh]
    assert any("outside the workdir" in e.get("refused", "") for e in entries)


def test_audit_lines(broker) -> None:
    broker.sh("broker-client -- sh -c 'exit 4'")
    with open(broker.audit) as fh:
        entries = [json.loads(line) for line in fh]
    last = [e for e in entries if e.get("argv") == ["sh", "-c", "exit 4"]][-1]
    assert last["exit"] == 4 and last["op"] == "exec" and last["cwd"] == broker.workdir
    assert {"time", "peer_pid", "peer_uid", "duration"} <= set(last)


def test_output_into_files_and_append_mode_is_intact(broker) -> None:
    data = os.urandom(3 << 20)
    with open(os.path.join(broker.workdir, "blob3"), "wb") as fh:
        fh.write(data)
    done = broker.sh(
        "broker-client -n -- cat blob3 > out.bin && printf x > app.bin && "
        "broker-client -n -- cat blob3 >> app.bin && broker-client -n -- cat blob3 > /dev/null"
    )
    assert done.returncode == 0, done.stderr
    with open(os.path.join(broker.workdir, "out.bin"), "rb") as fh:
        assert fh.read() == data
    with open(os.path.join(broker.workdir, "app.bin"), "rb") as fh:
        assert fh.read() == b"x" + data


def test_a_slow_reader_gets_all_of_a_stdin_larger_than_its_pipe(broker) -> None:
    """The command's stdin pipe fills up again and again: nothing lost, nothing reordered."""
    data = os.urandom(6 << 20)
    with open(os.path.join(broker.workdir, "slow-blob"), "wb") as fh:
        fh.write(data)
    reader = ("import hashlib, sys, time\n"
              "h = hashlib.sha256()\n"
              "while chunk := sys.stdin.buffer.raw.read(8192):\n"
              "    h.update(chunk)\n"
              "    time.sleep(0.0001) if len(chunk) % 3 == 0 else None\n"
              "print(h.hexdigest())\n")  # fmt: skip
    done = broker.sh(f"cat slow-blob | broker-client -- python3 -c '{reader}'", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == hashlib.sha256(data).hexdigest().encode()


def test_a_client_gone_while_the_stdin_pipe_is_full_ends_the_command(broker, tools) -> None:
    """The server stops reading the socket while the pipe is full; it still notices a hang-up."""
    marker = f"62.{os.getpid()}{len(broker.backend)}"
    feeder = subprocess.Popen(["head", "-c", str(16 << 20), "/dev/zero"], stdout=subprocess.PIPE)
    proc = subprocess.Popen(
        ["broker-client", "--", "sh", "-c", f"echo started; sleep {marker}; :"],
        cwd=broker.workdir, env=broker.env, stdin=feeder.stdout, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert feeder.stdout is not None
    feeder.stdout.close()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        assert tools.started(marker)
        time.sleep(0.3)  # the stdin pipe (1 MiB) fills and the server waits for room in it
        proc.kill()
        proc.wait()
        assert tools.gone(marker) == []
    finally:
        feeder.kill()
        feeder.wait()


def test_broker_client_from_a_start_script(broker, tmp_path) -> None:
    """The same client started as `python -I -S` (no site-packages): same contract."""
    import sys

    import libbroker
    from libbroker.native.start_script import start_script

    root = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))
    script = tmp_path / "broker-client"
    script.write_text(start_script(sys.executable, root, "bin.broker_client", "broker-client"))
    script.chmod(0o755)
    assert script.read_text().startswith(f"#!{sys.executable} -IS\n")
    done = broker.sh(f"printf 'b\\na\\n' | {script} -- sort; {script} -n -- sh -c 'exit 3'; "
                     f"echo $?; {script} -n -- no-such-command-xyz; echo $?")
    assert done.stdout.split() == [b"a", b"b", b"3", b"127"], done.stderr
    version = subprocess.run([str(script), "--version"], capture_output=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith(b"0.")
