"""The live gate through real sessions: a host git running meanwhile runs no plant.

As root (fanotify needs CAP_SYS_ADMIN), on both backends: a shell started
*before* the session, standing in the workdir (its working directory is the
mount from before the gate's binds), loops ``git status`` and ``git status``
in a new gitlink's directory while the session plants a ``commondir``, a
gitlink, a new git dir's config and hook, and a link named ``commondir``
to an innocent-looking file; the canary outside the workdir stays empty.
Without plants the host's git works meanwhile, the session's git too, and
no mount of the gate is left after the session, nor after a ``kill -9`` of
the launcher.  As an ordinary user the gate is off (no mounts) and the
watcher guards alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from launcher_world import World
from test_hostrun_live import _repo, _wait
from test_hostrun_sweep import git

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the gate needs root (fanotify)")

PLANTS = (
    "mkdir -p .gitc/objects .gitc/refs .gitc/hooks && echo 'ref: refs/heads/main' > .gitc/HEAD; "
    "hook() {{ printf '#!/bin/sh\\necho $2 >> {canary}/runs\\n' > $1; chmod +x $1; }}; "
    "i=0; touch planted; while [ ! -e go ] && [ $i -lt 400 ]; do "
    "printf '[core]\\n\\tfsmonitor = \"echo gitc >> {canary}/runs; false\"\\n' > .gitc/config; "
    "hook .gitc/hooks/post-index-change gitc-hook; hook .git/hooks/post-index-change hook; "
    "echo ../.gitc > .git/commondir; "
    "echo ../.gitc > x.txt; ln -sf ../x.txt .git/commondir 2>/dev/null; "
    "mkdir -p sub2 && echo 'gitdir: ../.gitc' > sub2/.git; "
    "i=$((i+1)); done"
)

# The host's git loops this many times while the session plants (a count, not a time:
# the same race on a fast machine and a slow one; about 2 s here).  ``{out}.raced``
# says it is done.
RACE = 100
HOST = (  # the person's terminal: there before the session, standing in the workdir
    "while [ ! -e planted ]; do sleep 0.01; done; n=0; "
    "while [ ! -e go ]; do touch a.txt; git status --porcelain >/dev/null 2>&1; "
    "[ -e sub2/.git ] && (cd sub2 && git status --porcelain >/dev/null 2>&1); "
    f"n=$((n+1)); [ $n -eq {RACE} ] && touch {{out}}.raced; done; echo $n > {{out}}"
)


def _mounts(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line for line in fh if str(path) in line.split()[4]]


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_shell_older_than_the_session_runs_no_plant(world: World, tmp_path: Path,
                                                       backend: str) -> None:
    work = _repo(world)
    canary = tmp_path / "canary"
    canary.mkdir()
    out = tmp_path / "iterations"
    env = {k: v for k, v in world.env().items() if not k.startswith("AGENT_SANDBOX")}
    env.update(GIT_CONFIG_NOSYSTEM="1", HOME=str(tmp_path))
    host = subprocess.Popen(["sh", "-c", HOST.format(out=out)], cwd=work, env=env)
    proc = world.launch("sh", "-c", PLANTS.format(canary=canary), sandbox=backend)
    try:
        _wait(work / "planted")
        assert _mounts(work), "the gate's binds while the session runs"
        _wait(Path(f"{out}.raced"), timeout=120)
        (work / "go").touch()
        _, err = proc.communicate(timeout=90)
        host.wait(timeout=30)
    finally:
        proc.kill()
        host.kill()
    assert proc.returncode == 0, err
    assert int(out.read_text()) > 0  # the host loop ran
    assert not (canary / "runs").exists(), (canary / "runs").read_text()
    assert "the live guard refused" in err, err
    assert _mounts(work) == []
    git(work, "status", "--short")  # after the sweep, git works and runs nothing
    assert not (canary / "runs").exists()


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_without_plants_the_hosts_git_works_meanwhile(world: World, backend: str) -> None:
    work = _repo(world)
    inside = ("git status --porcelain >/dev/null && echo b > b.txt && git add b.txt && "
              "git -c user.name=a -c user.email=a@a commit -q -m inside && touch planted && "
              "while [ ! -e go ]; do sleep 0.05; done")
    proc = world.launch("sh", "-c", inside, sandbox=backend)
    try:
        _wait(work / "planted")
        assert _mounts(work)
        (work / "a.txt").write_text("changed\n")  # an editor saving a file
        status = git(work, "status", "--short").stdout.splitlines()
        assert " M a.txt" in status and "?? remote.git/" in status, status
        assert git(work, "log", "--format=%s", "-1").stdout.strip() == "inside"
        git(work, "diff", "--quiet", check=False)
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "refused" not in err, err
    assert _mounts(work) == []


def test_a_killed_launcher_leaves_no_mount(world: World) -> None:
    """A launcher stopped with SIGSTOP holds the host's opens of workdir files (its gate's
    thread is stopped with it: docs/hostrun-gate.md); its kill -9 lets them go at once,
    and the janitor unbinds."""
    work = _repo(world)
    proc = world.launch("sh", "-c", "touch planted && exec sleep 60", sandbox="bwrap")
    _wait(work / "planted")
    assert len(_mounts(work)) == 2  # the workdir and its .git
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10  # every thread stopped (the gate's among them)
    while time.monotonic() < deadline and any(
            Path(f"/proc/{proc.pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
            != "T" for t in os.listdir(f"/proc/{proc.pid}/task")):
        time.sleep(0.01)
    reader = subprocess.Popen(["cat", str(work / "a.txt")], stdout=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        reader.wait(timeout=1)  # held by the stopped gate
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while _mounts(work) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _mounts(work) == []  # the janitor unbound them
    assert reader.communicate(timeout=30)[0] == "a\n"  # the kernel let it go with the group
    git(work, "status", "--short")


def _janitor_of(runtime_parent: Path) -> int:
    """The pid of the janitor whose runtime dir lies under ``runtime_parent``."""
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            janitor = any(b"agent-sandbox-janitor" in a for a in argv)
            if janitor and argv[-2].startswith(str(runtime_parent).encode()):
                return int(pid)
    raise AssertionError("no janitor")


def test_off_leaves_the_watcher_alone(world: World) -> None:
    """AGENT_SANDBOX_LIVE_GATE=off (what an ordinary user gets): no mounts; doctor says so.

    First a gated session whose launcher and janitor are both killed: its binds stay
    (nothing of it is left to unbind them) until the next start, this one's, unbinds
    them (its runtime dir's record, no longer locked) and says so."""
    work = _repo(world)
    dead = world.launch("sh", "-c", "touch planted && exec sleep 60", sandbox="bwrap")
    _wait(work / "planted")
    os.kill(_janitor_of(world.runtime_parent), signal.SIGKILL)
    os.kill(dead.pid, signal.SIGKILL)
    dead.communicate(timeout=30)
    time.sleep(0.5)
    assert len(_mounts(work)) == 2  # the workdir and its .git, with no one to unbind them
    (work / "planted").unlink()
    env = {**world.env(), "AGENT_SANDBOX_LIVE_GATE": "off"}
    proc = world.launch("sh", "-c", "touch planted; while [ ! -e go ]; do sleep 0.05; done",
                        sandbox="bwrap", env=env)
    try:
        _wait(work / "planted")
        assert _mounts(work) == []
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "a session that died with its janitor left its live guard's mounts on" in err, err
    assert not list(world.runtime_parent.glob("**/binds.json"))
    doctor = subprocess.run(["agent-sandbox", "doctor", f"--config={world.config()}"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert "live guard: the watcher alone" in doctor.stdout + doctor.stderr


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_an_ordinary_user_gets_the_watcher(backend: str) -> None:
    """No CAP_SYS_ADMIN: no gate, no mounts; the watcher still moves a planted commondir
    aside while the session runs, and doctor names the watcher."""
    import shutil
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
    from as_user import ordinary_user

    user = ordinary_user()
    if user.unavailable:
        pytest.skip(user.unavailable)
    tmp = Path(tempfile.mkdtemp(prefix="hostrun-gate-user-"))  # pytest's is 0700
    tmp.chmod(0o755)
    try:
        home, work, runtime = tmp / "home", tmp / "work", tmp / "run"
        for d in (home, work, runtime):
            d.mkdir()
        runtime.chmod(0o700)
        git(work, "init", "-q", "-b", "trunk")
        git(work, "commit", "-q", "--allow-empty", "-m", "init")
        config = tmp / "config.toml"
        config.write_text(f'workdir = "{work}"\ntoken_command = ""\nstart_timeout = 60\n')
        user.own(home, work, runtime, config)
        env = user.env(home, XDG_RUNTIME_DIR=str(runtime), GIT_CONFIG_NOSYSTEM="1")
        env["PATH"] = os.path.dirname(sys.executable) + ":" + env.get("PATH", "/usr/bin:/bin")
        inside = ("echo ../x > .git/commondir; touch planted; "
                  "while [ ! -e go ]; do sleep 0.05; done")
        proc = subprocess.Popen(
            user.argv(["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}",
                       "--", "sh", "-c", inside]),
            env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL)
        try:
            _wait(work / "planted", 60)
            assert _mounts(work) == []
            deadline = time.monotonic() + 10
            while (work / ".git/commondir").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not (work / ".git/commondir").exists()  # the watcher, meanwhile
            (work / "go").touch()
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        doctor = subprocess.run(user.argv(["agent-sandbox", "doctor", f"--config={config}"]),
                                env=env, cwd=work, capture_output=True, text=True, timeout=60)
        said = doctor.stdout + doctor.stderr
        assert "live guard: the watcher alone" in said, said
        assert "install and start the gate service" in said, said  # the fix
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_second_session_on_the_workdir_keeps_the_first_ones_gate(world: World) -> None:
    """Two gates stacked on one workdir would unbind each other's mounts: the second
    session runs with the watcher alone, says so, and the first one's mounts stay."""
    work = _repo(world)
    first = world.launch("sh", "-c", "touch planted; while [ ! -e go ]; do sleep 0.05; done",
                         sandbox="bwrap")
    try:
        _wait(work / "planted")
        held = _mounts(work)
        second = world.run("true", sandbox="nono")
        assert second.returncode == 0, second.stderr
        assert "the live gate is off in this session" in second.stderr, second.stderr
        assert _mounts(work) == held
        (work / "go").touch()
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert _mounts(work) == []


def _gated(world: World) -> tuple[Path, Any, Any, Path, Any]:
    """A repository scanned, its watcher ready and a gate started on it (in-process)."""
    from libbroker.launcher import hostrun_live, hostrun_scan
    from libbroker.launcher.hostrun_gate import Gate
    from libpolicy.hostrun import Table

    work = _repo(world)
    snap = hostrun_scan.scan(str(work), Table())
    state = world.home / ".local/state/agent-sandbox"
    watcher = hostrun_live.begin(snap, str(state), "", swap=True)
    watcher.start()
    watcher.wait_ready()
    record = world.root / "gate-record"
    record.mkdir()
    gate = Gate(snap, watcher, str(record))
    gate.start()
    return work, snap, watcher, record, gate


def test_a_gate_that_dies_never_holds_the_host(world: World) -> None:
    """The gate's thread fails (its group's fd gone under it): the kernel allows what waits
    and drops the marks, host opens go through, the end says so and unbinds."""
    from libbroker.launcher import hostrun_live

    work, snap, watcher, record, gate = _gated(world)
    try:
        assert len(_mounts(work)) == 2
        assert (work / "a.txt").read_text() == "a\n"  # judged and allowed
        assert gate.fan is not None
        # The group's fd gone under the thread: its number now holds an O_PATH fd (poll says
        # POLLNVAL, a read EBADF, so the thread ends), never a number free for this process's
        # next open (a.txt's, a pipe of git's) that the thread would read and stop() close.
        gone = os.open("/", os.O_PATH | os.O_CLOEXEC)
        os.dup2(gone, gate.fan.fd)
        os.close(gone)
        (work / "a.txt").touch()  # may wake it; must not wait on it
        deadline = time.monotonic() + 10
        while not gate.died and time.monotonic() < deadline:
            (work / "a.txt").read_text()
            time.sleep(0.05)
        assert gate.died
        git(work, "status", "--short")  # the host is not held by a dead gate
    finally:
        lines = gate.stop()
        hostrun_live.end(watcher, snap)
    assert any("the live gate stopped during the session" in line for line in lines), lines
    assert _mounts(work) == []
    assert not (record / "binds.json").exists()


def test_a_failed_sweep_still_unbinds(world: World) -> None:
    """The end's sweep fails (a disk error, say): the gate still goes, binds and record,
    before the error goes on (the runtime dir, the record's home, is removed after)."""
    from libbroker.launcher.session_guards import Guards

    work, snap, watcher, record, gate = _gated(world)

    class FailingSweep:  # the workdir's guard, whose end sweep fails
        def __init__(self) -> None:
            self.snap = snap

        def finish(self, quiet: object = None) -> None:
            raise OSError(errno.EIO, "the sweep failed")

    guards = Guards()
    guards.live, guards.gate, guards.hostrun = watcher, gate, FailingSweep()  # type: ignore[assignment]
    with pytest.raises(OSError, match="the sweep failed"):
        guards.end()
    assert guards.gate is None
    assert _mounts(work) == []
    assert not (record / "binds.json").exists()


def test_the_end_puts_configs_back_beneath_the_gate(world: World) -> None:
    """The end's put-back goes through the fds the gate took beneath its binds: the merged
    config is a regular file again (the host's copy itself, exchanged), and none of the
    launcher's opens waited on the gate's thread, which stayed up for everyone else."""
    from libbroker.launcher import hostrun_live

    work, snap, watcher, _, gate = _gated(world)
    try:
        assert sorted(gate.binds.under) == ["", ".git"]  # the workdir and its .git beneath
        (repo,) = (r for r in watcher.configs.repos if r.git == ".git")
        inside = Path(watcher.configs.inside_dir(repo)) / "config"
        inside.write_text(inside.read_text() + "[user]\n\temail = e@example.com\n")
        own = gate.own
        lines = hostrun_live.end(watcher, snap, gate.binds.under)
        assert gate.own == own, "the put-back waited on the gate"
        assert git(work, "config", "--get", "user.email").stdout.strip() == "e@example.com"
        st = (work / ".git/config").lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
        assert not any(".git/config" in line for line in lines), lines
        assert gate.asked > 0  # the host's git above was judged: the gate was up
    finally:
        gate.stop()
    assert _mounts(work) == []


@pytest.mark.parametrize("hold", [False, True])
def test_binds_under_a_shared_mount_go_with_one_read_of_mountinfo(tmp_path: Path,
                                                                   hold: bool) -> None:
    """On a shared mount (systemd makes / shared) the workdir's bind joins its peer group,
    so each ``.git`` bind propagates a copy onto it: the one read of mountinfo the removal
    makes must drop those copies with the workdir's bind, and leave nothing mounted.
    ``hold`` (the gate service's way): each bind detached through the fd held on it."""
    from libbroker.launcher.hostrun_binds import Binds

    top = tmp_path / "shared"
    top.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(top)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(top)], check=True)
        work = top / "w"
        gits = [f"r{i}/.git" for i in range(3)]
        for g in gits:
            (work / g).mkdir(parents=True)
        binds = Binds(str(work), gits, str(tmp_path), hold=hold)
        binds.make()
        binds.marked()
        try:
            assert len(_mounts(work)) > 1 + len(gits)  # the copies propagated
            assert sorted(binds.under) == ["", *gits]
        finally:
            lines = binds.remove()
        assert lines == []
        assert _mounts(work) == []
        assert not (tmp_path / "binds.json").exists()
    finally:
        subprocess.run(["umount", "-l", str(top)], check=True)


def test_only_dead_sessions_binds_are_repaired(tmp_path: Path) -> None:
    """The repair at a start (and in doctor) unbinds what a record names only when no
    launcher holds that record locked, only from a directory and file of ours, and never a
    mount a live session's record names."""
    from libbroker.launcher import hostrun_binds

    works, records = [tmp_path / "w1", tmp_path / "w2"], [tmp_path / "s1", tmp_path / "s2"]
    for w, r in zip(works, records, strict=True):
        (w / "r/.git").mkdir(parents=True)
        r.mkdir()
    live = hostrun_binds.Binds(str(works[0]), ["r/.git"], str(records[0]))
    live.make()
    dead = hostrun_binds.Binds(str(works[1]), ["r/.git"], str(records[1]))
    dead.make()
    try:
        assert dead._record is not None  # its launcher dies: the lock goes, the mounts stay
        os.close(dead._record.fd)
        forged = tmp_path / "other-user"  # as root, another user's dir naming our mounts
        forged.mkdir()
        (forged / "binds.json").write_bytes((records[0] / "binds.json").read_bytes())
        os.chown(forged / "binds.json", 65534, 65534)
        os.chown(forged, 65534, 65534)
        lines = hostrun_binds.repair([str(r) for r in (*records, forged, tmp_path / "none")])
        assert _mounts(works[1]) == [] and not (records[1] / "binds.json").exists()
        assert len(lines) == 1 and str(works[1]) in lines[0] and "unbound them" in lines[0]
        assert len(_mounts(works[0])) == 2 and (records[0] / "binds.json").exists()
    finally:
        dead._record = None
        dead.made = []
        dead.remove()
        assert live.remove() == []
    assert _mounts(works[0]) == [] and not (records[0] / "binds.json").exists()


def test_a_repository_moved_during_the_session_is_unbound_where_it_went(tmp_path: Path) -> None:
    """A directory that holds a mount point may be renamed: a repository moved within the
    workdir takes its ``.git`` bind along, and the end unbinds it there (by its id); moved
    out of the workdir it cannot be (its ``.git`` is a mount point: EBUSY), as said in
    docs/hostrun-gate.md."""
    from libbroker.launcher.hostrun_binds import Binds

    work = tmp_path / "w"
    (work / "repo/.git").mkdir(parents=True)
    (work / "repo/.git/HEAD").write_text("ref: refs/heads/main\n")
    binds = Binds(str(work), ["repo/.git"], str(tmp_path))
    binds.make()
    try:
        os.rename(work / "repo", work / "moved")
        assert (work / "moved/.git/HEAD").exists()
        out = subprocess.run(["mv", str(work / "moved"), str(tmp_path / "away")],
                             capture_output=True, text=True)
        assert out.returncode != 0 and "busy" in out.stderr, out.stderr
    finally:
        lines = binds.remove()
    assert lines == []
    assert _mounts(work) == [] and _mounts(tmp_path) == []


@pytest.mark.parametrize("size", [0, 1, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 1 << 20])
def test_the_gates_digest_of_an_open_file_is_the_starts_digest(tmp_path: Path, size: int) -> None:
    # A host-run file restored as a new inode is allowed when its bytes are those the
    # start recorded: the gate's streamed digest (both gates) must equal the scan's.
    from libbroker.launcher.hostrun_fingerprint import digest_of, digest_of_fd

    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert digest_of_fd(fd) == digest_of(data)
    finally:
        os.close(fd)


def test_the_gates_end_drops_its_marks_before_the_close(tmp_path: Path) -> None:
    """Fanotify.flush_mounts (the gate's end, before unbinding and closing the group, for
    an expedited grace period at the close): from then on an open through the bind goes on
    unanswered and queues nothing, while the group itself is still open."""
    import select

    from libbroker.launcher import fanotify
    from libbroker.launcher.hostrun_binds import Binds

    work = tmp_path / "w"
    work.mkdir()
    (work / "f").write_text("x")
    binds = Binds(str(work), [], str(tmp_path))
    fan = fanotify.Fanotify()
    try:
        binds.make()
        for fd in binds.mark_fds:
            fan.mark_mount(fd)
        binds.marked()
        cat = subprocess.Popen(["cat", str(work / "f")], stdout=subprocess.PIPE)
        assert select.select([fan.fd], [], [], 10)[0], "a marked open reached no one"
        for ev in fan.read():  # it waits for us
            fan.answer(ev, True)
        assert cat.communicate(timeout=10)[0] == b"x"
        fan.flush_mounts()
        done = subprocess.run(["cat", str(work / "f")], capture_output=True, timeout=10)
        assert done.stdout == b"x"
        assert not select.select([fan.fd], [], [], 0.1)[0], "an open reached the flushed group"
    finally:
        fan.close()
        binds.remove()
    assert _mounts(work) == []


def _marked_inodes(fd: int) -> list[str]:
    """The inode marks an fsnotify group's fd holds (its fdinfo), by inode number."""
    with open(f"/proc/self/fdinfo/{fd}") as fh:
        return [line.split("ino:")[1].split()[0] for line in fh if " ino:" in line]


def test_the_end_holds_the_watchers_connectors_and_leaves_nothing(world: World) -> None:
    """Guards.end with our own gate: from the watcher's stop the gate's group holds an
    inert mark on each watched directory (the watcher's close then frees no fsnotify
    connector: an expedited grace period), drops them after that close, and is closed
    last (Guards.closed); no bind, no record, no group left, the watcher's closed too."""
    from libbroker.launcher.session_guards import Guards

    work, _, watcher, record, gate = _gated(world)
    # (the workdir's: the private configs' dirs are removed by the put-back meanwhile)
    watched = {format(os.stat(p).st_ino, "x") for p in watcher.watched()
               if p == str(work) or p.startswith(f"{work}/")}
    assert format(os.stat(work).st_ino, "x") in watched and len(watched) > 1
    seen: dict[str, list[str]] = {}
    release = gate.release

    def released() -> None:  # what the group held when the watcher's group was closed
        assert watcher._ino.fd < 0, "released before the watcher's group was closed"
        seen["held"] = _marked_inodes(gate.fan.fd)
        release()
        seen["after"] = _marked_inodes(gate.fan.fd)

    gate.release = released
    guards = Guards()
    guards.live, guards.gate = watcher, gate
    guards.end(join=False)
    assert gate.held and gate.fan.fd >= 0  # open until closed(), with nothing marked
    assert set(seen["held"]) >= watched, seen
    assert seen["after"] == []
    assert _mounts(work) == [] and not (record / "binds.json").exists()
    guards.closed()
    assert gate.fan.fd < 0


def test_a_hold_never_follows_a_last_link(tmp_path: Path) -> None:
    """Fanotify.hold marks the directory itself, never what a link there names."""
    from libbroker.launcher import fanotify

    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    fan = fanotify.Fanotify()
    try:
        with pytest.raises(OSError):
            fan.hold(str(tmp_path / "link"))
        assert _marked_inodes(fan.fd) == []
        fan.hold(str(tmp_path / "d"))
        assert _marked_inodes(fan.fd) == [format((tmp_path / "d").stat().st_ino, "x")]
        fan.flush_inodes()
        assert _marked_inodes(fan.fd) == []
    finally:
        fan.close()
