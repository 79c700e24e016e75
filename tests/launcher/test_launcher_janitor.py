"""The janitor: a launcher that dies leaves nothing; one that says done leaves the janitor idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from libbroker.launcher import boot, janitor


def _start(r: int, runtime: Path) -> subprocess.Popen[bytes]:
    module = "libbroker.launcher.janitor"
    argv = [*boot.python_argv("agent-sandbox-janitor", module, [sys.executable, "-m", module]),
            str(r), str(runtime)]
    return subprocess.Popen(argv, pass_fds=(r,), process_group=0)


def test_end_of_file_ends_the_children_and_removes_the_runtime_dir(tmp_path: Path) -> None:
    runtime = tmp_path / "session"
    (runtime / "egress").mkdir(parents=True)
    (runtime / "egress" / "ca.pem").write_text("x")
    child = subprocess.Popen(["sleep", "60"])
    r, w = os.pipe()
    proc = _start(r, runtime)
    os.close(r)
    os.write(w, f"{child.pid} 0\n".encode())
    os.close(w)  # the launcher "dies"
    assert proc.wait(30) == 0
    assert child.wait(10) == -15  # SIGTERM first
    assert not runtime.exists()


def test_done_leaves_everything_to_the_launcher(tmp_path: Path) -> None:
    runtime = tmp_path / "session"
    runtime.mkdir()
    child = subprocess.Popen(["sleep", "60"])
    r, w = os.pipe()
    proc = _start(r, runtime)
    os.close(r)
    os.write(w, f"{child.pid} 0\ndone\n".encode())
    os.close(w)
    try:
        assert proc.wait(30) == 0
        assert child.poll() is None and runtime.exists()
    finally:
        child.kill()
        child.wait()


def test_bad_arguments_are_a_usage_error() -> None:
    assert janitor.main(["x"]) == 2


def test_the_session_janitor_runs_at_the_lowest_priority_and_goes_when_dismissed(
    tmp_path: Path,
) -> None:
    from libbroker.launcher import supervise

    j = supervise.Janitor(str(tmp_path))
    pid = j._proc.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(fields[16]) == 19  # nice: its start-up yields to the servers'
    j.dismiss()
    assert j._proc.returncode == 0 and tmp_path.exists()
