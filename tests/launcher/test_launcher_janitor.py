"""The janitor: a launcher that dies leaves nothing; one that says done leaves the janitor idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_without_a_runtime_dir_the_session_dir_is_made_in_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No XDG_RUNTIME_DIR: a private directory in the temporary directory, found as
    tempfile finds it ($TMPDIR first), made as mkdtemp makes it (0700, a new name), and
    listed among the session dirs a later start looks at."""
    import tempfile

    from libbroker.launcher import runtime_dir

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(runtime_dir, "_tmp", None)
    tempfile.tempdir = None  # its cache: asked again, from the same environment
    try:
        assert runtime_dir.temp_dir() == tempfile.gettempdir() == str(tmp_path)
    finally:
        tempfile.tempdir = None
    rts = [runtime_dir.create() for _ in range(3)]
    try:
        for rt in rts:
            assert os.path.dirname(rt.root) == str(tmp_path)
            assert os.path.basename(rt.root).startswith("agent-sandbox-")
            assert len(os.path.basename(rt.root)) == len("agent-sandbox-") + 8
            assert os.stat(rt.root).st_mode & 0o777 == 0o700
            assert os.path.isdir(rt.host_only)
        assert len({rt.root for rt in rts}) == 3
        assert {rt.root for rt in rts} <= set(runtime_dir.session_dirs())
    finally:
        for rt in rts:
            runtime_dir.remove(rt)
    assert not any(os.path.exists(rt.root) for rt in rts)
    monkeypatch.setattr(runtime_dir, "_tmp", None)


@pytest.mark.parametrize("runtime_in_workdir", [False, True])
def test_a_workdir_holding_the_temporary_dir_gets_its_runtime_dir_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_in_workdir: bool
) -> None:
    """$TMPDIR (and $XDG_RUNTIME_DIR) inside the workdir, or the workdir itself: the
    runtime dir is made in /var/tmp (else /dev/shm), and the janitor's list finds it
    there; a workdir beside them leaves them as they were."""
    from libbroker.launcher import runtime_dir

    work = tmp_path / "work"
    tmp = work / "tmp" if runtime_in_workdir else tmp_path / "tmp"
    tmp.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp))
    monkeypatch.setattr(runtime_dir, "_tmp", None)
    try:
        for workdir in (str(work), str(tmp)):
            rt = runtime_dir.create(workdir)
            try:
                parent = os.path.dirname(rt.root)
                if runtime_in_workdir or workdir == str(tmp):
                    assert parent in ("/var/tmp", "/dev/shm"), rt.root
                    assert os.path.basename(rt.root).startswith("agent-sandbox-")
                    assert os.stat(rt.root).st_mode & 0o777 == 0o700
                else:  # (a deep $XDG_RUNTIME_DIR, as pytest's, falls back to $TMPDIR)
                    assert parent in (str(tmp / "agent-sandbox"), str(tmp)), rt.root
                assert rt.root in runtime_dir.session_dirs()
            finally:
                runtime_dir.remove(rt)
            assert not os.path.lexists(rt.root)
    finally:
        monkeypatch.setattr(runtime_dir, "_tmp", None)


def test_bwraps_argument_limit_is_said_with_whose_arguments_they_are() -> None:
    from libbroker.launcher.agent_sandbox import too_many_args

    assert too_many_args(20628, repos=1735, guard=20544, own=2) == (
        "bwrap cannot take this session: its command line would be 20628 arguments long "
        "and bwrap takes at most 9000; 20544 of them pin and hold read-only the hooks and "
        "configs of the workdir's 1735 git directories: start it in one repository (or name "
        "one with --workdir), or use --sandbox=nono")
    assert too_many_args(9081, repos=1, guard=9, own=9001).endswith(
        "; 9001 of them are the command's: pass them in a file, or use --sandbox=nono")


def test_the_runtime_dir_goes_whole_and_never_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the command left in the runtime dir (Landlock's TMPDIR is there) goes, a
    directory it made unwritable included; a link out of it is removed, not followed."""
    from libbroker.launcher import runtime_dir

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("x")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(runtime_dir, "_tmp", None)
    rt = runtime_dir.create()
    deep = Path(rt.root) / "tmp" / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "file").write_text("y")
    (Path(rt.root) / "tmp" / "out").symlink_to(outside)
    (Path(rt.host_only) / "secrets").write_text("z")
    (deep.parent).chmod(0o500)
    runtime_dir.remove(rt)
    assert not os.path.lexists(rt.root) and not os.path.lexists(rt.host_only)
    assert (outside / "kept").read_text() == "x"
    runtime_dir.remove(rt)  # gone already: nothing to do
    monkeypatch.setattr(runtime_dir, "_tmp", None)
