"""Empty lock files left by refused creates (hostrun_locks): real fanotify, real host programs.

A bind of the workdir onto itself is marked as the gate marks it
(:class:`.hostrun_binds.Binds`, :class:`.fanotify.Fanotify` with the opener's
thread), and a thread answers as a gate would: every open of a ``*.lock`` is
refused, noted first (:meth:`.Locks.note`), everything else allowed.  A real
host ``git`` refused its ``index.lock`` leaves it empty, and git fails until it
is removed; :meth:`.Locks.remove`, beneath the bind, removes exactly that file
and git works again.  Left alone: a lock written to meanwhile, one whose inode
was replaced, a link in its place, one still open, one there before the refusal,
and one made by a create without ``O_EXCL``.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_world import World
from test_hostrun_sweep import git

from libbroker.launcher import fanotify
from libbroker.launcher.hostrun_binds import Binds
from libbroker.launcher.hostrun_locks import OPENS, Locks, created_here

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root")


class Gated:
    """The workdir bound and marked; ``*.lock`` opens refused and noted (or held)."""

    def __init__(self, work: Path, record: Path, *, hold: bool = False) -> None:
        """``hold``: the ``*.lock`` opens are kept in :attr:`held`, unanswered (the test
        answers them), instead of refused at once."""
        self.work = work
        self.hold = hold
        self.held: list[fanotify.Event] = []
        self.answered = 0  # the opens allowed
        self.binds = Binds(str(work), [], str(record))
        self.fan = fanotify.Fanotify(report_tid=True)
        self.locks = Locks(os.path.realpath(work))
        self.refused: list[str] = []
        self._stop_r, self._stop_w = os.pipe()
        self.binds.make()
        for fd in self.binds.mark_fds:
            self.fan.mark_mount(fd)
        self.binds.marked()
        self.root = os.dup(self.binds.under[""])  # beneath the bind: no event
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            ready = select.select([self.fan.fd, self._stop_r], [], [])[0]
            if self._stop_r in ready:
                return
            for ev in self.fan.read():
                if ev.fd < 0:
                    continue
                path = os.readlink(f"/proc/self/fd/{ev.fd}")
                allow = not path.endswith(".lock")
                if allow:
                    self.answered += 1
                elif self.hold:
                    self.held.append(ev)
                    continue
                else:
                    self.refused.append(path)
                    self.locks.note(ev.fd, ev.pid)  # before the answer, as the gates do
                self.fan.answer(ev, allow)

    def stop(self) -> None:
        """The gate's end: marks flushed, thread ended, binds gone (the pins stay)."""
        with contextlib.suppress(OSError):
            self.fan.flush_mounts()
        os.write(self._stop_w, b"x")
        self._thread.join(10)
        self.binds.remove()
        self.fan.close()

    def close(self) -> None:
        for fd in (self.root, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks.close()


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    work = tmp_path / "w"
    work.mkdir()
    git(work, "init", "-q", "-b", "trunk")
    (work / "a.txt").write_text("a\n")
    git(work, "add", "a.txt")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return work


@pytest.fixture()
def gated(work: Path, tmp_path: Path) -> Iterator[Gated]:
    if os.uname().machine not in OPENS:
        pytest.skip("no open flags from /proc/TID/syscall on this machine")
    found = Gated(work, tmp_path)
    try:
        yield found
    finally:
        found.stop()
        found.close()


def _sh(work: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], cwd=work, capture_output=True, text=True,
                          timeout=30)


def test_a_host_gits_refused_index_lock_is_removed_and_git_works_again(
        work: Path, gated: Gated) -> None:
    (work / "b.txt").write_text("b\n")
    added = git(work, "add", "b.txt", check=False)
    assert added.returncode != 0 and "index.lock" in added.stderr, added.stderr
    lock = work / ".git/index.lock"
    assert lock.stat().st_size == 0, "the refused create left its empty file"
    assert [n.rel for n in gated.locks.noted] == [".git/index.lock"]
    gated.stop()
    again = git(work, "add", "b.txt", check=False)  # what the user met before the fix
    assert again.returncode != 0 and "index.lock': File exists" in again.stderr, again.stderr
    lines = gated.locks.remove(gated.root)
    assert lines == ["agent-sandbox: removed .git/index.lock: the empty lock file that a host "
                     "process's create, refused by the live guard, left (git)"], lines
    assert not lock.exists()
    git(work, "add", "b.txt")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "b")
    assert git(work, "status", "--short").stdout == ""


def test_only_the_very_empty_file_the_refused_create_made_is_removed(
        work: Path, gated: Gated) -> None:
    # there before (made beneath the bind: no event): its refused open made nothing
    os.close(os.open("before.lock", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=gated.root))
    made = _sh(work, "for n in gone written replaced linked held; do "
                     "(set -C; : > $n.lock) 2>/dev/null; done; cat before.lock 2>/dev/null; "
                     "(: >> appended.lock) 2>/dev/null; exit 0")
    assert made.returncode == 0, made.stderr
    assert sorted(Path(p).name for p in gated.refused) == sorted(
        ["gone.lock", "written.lock", "replaced.lock", "linked.lock", "held.lock",
         "before.lock", "appended.lock"])
    # noted: only the creates with O_EXCL (an O_CREAT without it may have opened a lock
    # that was there), and never the open of one that was there
    assert sorted(n.rel for n in gated.locks.noted) == sorted(
        ["gone.lock", "written.lock", "replaced.lock", "linked.lock", "held.lock"])
    gated.stop()
    (work / "written.lock").write_text("pid 42\n")  # someone's content: the user's
    (work / "replaced.lock").unlink()
    (work / "replaced.lock").touch()  # another empty file (the old inode is pinned)
    replaced = (work / "replaced.lock").stat().st_ino
    (work / "linked.lock").unlink()
    (work / "linked.lock").symlink_to("a.txt")
    holder = subprocess.Popen(["sh", "-c", "exec 3<held.lock; read x"], cwd=work,
                              stdin=subprocess.PIPE)
    try:
        _wait_open(holder.pid, work / "held.lock")
        lines = gated.locks.remove(gated.root)
    finally:
        holder.communicate(b"\n", timeout=10)
    assert [line.split()[2] for line in lines] == ["gone.lock:"], lines
    assert not (work / "gone.lock").exists()
    assert (work / "written.lock").read_text() == "pid 42\n"
    assert (work / "replaced.lock").stat().st_ino == replaced
    assert (work / "linked.lock").is_symlink() and (work / "a.txt").read_text() == "a\n"
    assert (work / "held.lock").exists() and (work / "before.lock").exists()
    assert (work / "appended.lock").exists()
    assert not [p for p in os.listdir(work) if p.startswith(".agent-sandbox-lock-")]


def _wait_open(pid: int, path: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path)
                   for fd in os.listdir(f"/proc/{pid}/fd")):
                return
        time.sleep(0.01)
    raise AssertionError(f"{path} was never opened by {pid}")


def test_created_here_reads_only_open_and_openat_with_create_and_excl(tmp_path: Path) -> None:
    """A thread blocked elsewhere (a read), or /proc of another machine: not a create."""
    reader = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.2)
        assert not created_here(reader.pid)
        assert not created_here(reader.pid, machine="riscv64")
    finally:
        reader.communicate(b"\n", timeout=10)
    assert not created_here(2**22 + 7)  # no such thread


def test_a_lock_create_is_noted_while_the_gate_answers_other_opens(
        work: Path, tmp_path: Path) -> None:
    """Each answer to an open wakes every opener that waits on the group, the create of
    the lock too, which then reads "running" in /proc/TID/syscall for a moment, though
    it is still in its open: the gate service's burst of refusals (a stopped launcher)
    did that just before it noted the probe's lock, which was then left (one run in
    two under load).  The create is noted however often it was just woken."""
    if os.uname().machine not in OPENS:
        pytest.skip("no open flags from /proc/TID/syscall on this machine")
    gated = Gated(work, tmp_path, hold=True)
    made = subprocess.Popen(["sh", "-c", "set -C; : > x.lock"], cwd=work, text=True,
                            stderr=subprocess.PIPE)
    noise = None
    try:
        deadline = time.monotonic() + 10
        while not gated.held and time.monotonic() < deadline:
            time.sleep(0.01)
        (create,) = gated.held
        noise = subprocess.Popen(["sh", "-c", "while :; do cat a.txt; done"], cwd=work,
                                 stdout=subprocess.DEVNULL)
        missed, tries = 0, 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # before the fix: 18-637 of 14,000-22,000 missed
            locks = Locks(os.path.realpath(work))
            locks.note(create.fd, create.pid)
            missed += [n.rel for n in locks.noted] != ["x.lock"]
            tries += 1
            locks.close()
        assert gated.answered > 200, "the other opens woke the create's opener"
        assert missed == 0, f"{missed} of {tries} notes missed the create"
    finally:
        if noise is not None:
            noise.kill()
            noise.wait()
        for ev in gated.held:
            gated.fan.answer(ev, False)
        _, err = made.communicate(timeout=10)
        gated.stop()
        gated.close()
    assert made.returncode != 0 and "Operation not permitted" in err, err


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_sessions_gate_removes_the_lock_its_refusal_left(world: World, backend: str) -> None:
    """Root's own gate: a host create of a lock in a git directory the session made is
    refused (its file stays, empty); after the sweep the launcher removes exactly it."""
    from test_hostrun_live import _repo, _wait

    work = _repo(world)
    (work / "kept.lock").write_text("")  # the user's, from before: never touched
    inside = ("mkdir -p sub/.git/objects sub/.git/refs && echo 'ref: refs/heads/m' > "
              "sub/.git/HEAD && touch planted && while [ ! -e go ]; do sleep 0.05; done")
    proc = world.launch("sh", "-c", inside, sandbox=backend)
    try:
        _wait(work / "planted")
        made = _sh(work, "set -C; : > sub/.git/index.lock")
        assert made.returncode != 0 and "Operation not permitted" in made.stderr, made.stderr
        assert (work / "sub/.git/index.lock").stat().st_size == 0  # the kernel made it
        (work / "go").touch()
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "agent-sandbox: removed sub/.git/index.lock: the empty lock file" in err, err
    assert not (work / "sub/.git/index.lock").exists()
    assert (work / "kept.lock").exists()


def test_the_launcher_takes_only_relative_names_from_the_services_list() -> None:
    from libbroker.launcher.hostrun_gate_client import _locks

    said = [[".git/index.lock", 1, 2, "git"], ["/etc/x.lock", 1, 2, "git"],
            ["../x.lock", 1, 2, "git"], ["a/../../x.lock", 1, 2, "git"], ["", 1, 2, "git"],
            [".git/a.lock", "1", 2, "git"], [".git/b.lock", 1, 2], "x"]
    assert _locks(said) == [(".git/index.lock", 1, 2, "git")]
    assert _locks(None) == []
