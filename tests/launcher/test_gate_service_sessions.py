"""An ordinary user's sessions gated by the real gate service: the live window is closed.

The service runs as root (:mod:`gate_service_world`); the sessions run as a
throwaway ordinary user (``as_user``), which has no CAP_SYS_ADMIN, so without
the service it would get the watcher alone.  On each backend a shell of that
user, started *before* the session and standing in the workdir (a person's
terminal), loops ``git status`` there and in a new gitlink's directory while
the session plants in a loop (the plants of test_hostrun_gate.py): the
canary stays empty.  Then, on bwrap, the launcher is stopped (SIGSTOP): a host
open by the user is refused within the service's patience, not held without
bound (a create refused so leaves its empty file: the launcher removes it after
the sweep); the session then ends as usual and the service unbinds.  On Landlock
the launcher is killed (``kill -9``) instead: the service unbinds at once, the
janitor sweeps, the host's git runs nothing after, and the next session starts
clean.  Root's launcher, which could gate alone, prefers the service when it is
there: a stopped root launcher holds no open without bound either.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gate_service_world import PATIENCE, Service, mounts, running, user_sh
from launcher_world import World
from test_hostrun_gate import HOST, PLANTS, _janitor_of
from test_hostrun_live import _repo, _wait
from test_hostrun_sweep import git

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))

from as_user import OrdinaryUser, ordinary_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the service runs as root")


@pytest.fixture(scope="module")
def user() -> OrdinaryUser:
    found = ordinary_user()
    if found.unavailable:
        pytest.skip(found.unavailable)
    if found.prefix and not found.works(["bwrap", "--ro-bind", "/", "/", "true"]):
        pytest.skip("bwrap cannot make a user namespace as an ordinary user here")
    return found


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with running() as found:
        yield found


@pytest.fixture()
def place(user: OrdinaryUser) -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="gate-user-", dir="/tmp"))  # pytest's is 0700
    top.chmod(0o755)
    for d in ("home", "work", "run", "canary"):
        (top / d).mkdir()
    (top / "run").chmod(0o700)
    work = top / "work"
    git(work, "init", "-q", "-b", "trunk")
    (work / "a.txt").write_text("a\n")
    git(work, "add", "a.txt")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    (top / "config.toml").write_text(f'workdir = "{work}"\ntoken_command = ""\n'
                                     "start_timeout = 60\n")
    user.own(top / "home", work, top / "run", top / "canary", top / "config.toml")
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _env(user: OrdinaryUser, place: Path, service: Service) -> dict[str, str]:
    env = user.env(place / "home", XDG_RUNTIME_DIR=str(place / "run"), GIT_CONFIG_NOSYSTEM="1",
                   AGENT_SANDBOX_GATE_SOCKET=service.socket)
    env["PATH"] = os.path.dirname(sys.executable) + ":" + env.get("PATH", "/usr/bin:/bin")
    return env


def _session(user: OrdinaryUser, place: Path, env: dict[str, str], backend: str,
             script: str) -> subprocess.Popen[str]:
    argv = ["agent-sandbox", "run", f"--sandbox={backend}", f"--config={place / 'config.toml'}",
            "--", "sh", "-c", script]
    return subprocess.Popen(user.argv(argv), env=env, cwd=place / "work", text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def _after(service: Service, work: Path) -> str:
    """The service's log since it began gating ``work``."""
    return service.log().split(f"gating '{work}'", 1)[-1]


def _stopped(pid: int) -> bool:
    return all(Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
               == "T" for t in os.listdir(f"/proc/{pid}/task"))


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_an_ordinary_users_session_is_gated_by_the_service(
        user: OrdinaryUser, service: Service, place: Path, backend: str) -> None:
    work, canary = place / "work", place / "canary"
    env = _env(user, place, service)
    count = canary / "iterations"
    host = user_sh(user, HOST.format(out=count), work, env)
    proc = _session(user, place, env, backend, PLANTS.format(canary=canary))
    try:
        _wait(work / "planted", 60)
        assert len(mounts(work)) == 2, "the service's binds: the workdir and its .git"
        time.sleep(4)  # the host loop against the plants
        if backend == "bwrap":
            _a_stopped_launcher_holds_no_open_without_bound(user, proc.pid, work, env)
            (work / "go").touch()
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            assert "the live guard refused" in err, err
            assert "agent-sandbox: removed .git/probe.lock: the empty lock file" in err, err
            assert not (work / ".git/probe.lock").exists()
            # The host loop's git may have been refused its own index.lock meanwhile: that
            # one was removed too (or git, refused a later open, removed its own).
            assert not (work / ".git/index.lock").exists()
            # The service says it when the launcher's 'done' came, which the launcher does
            # not wait for: its exit may come first.
            said = "'.git/probe.lock', the empty lock file a refused create left: the " \
                "launcher removed it"
            deadline = time.monotonic() + 10
            while said not in _after(service, work) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert said in _after(service, work), _after(service, work)
        else:
            (work / "go").touch()
            host.wait(timeout=60)
            janitor = os.pidfd_open(_janitor_of(place / "run"))
            os.kill(proc.pid, signal.SIGKILL)  # the launcher; its janitor stays
            t0 = time.monotonic()
            _, err = proc.communicate(timeout=90)
            poller = select.poll()  # the janitor's output is /dev/null: its end, by its pidfd
            poller.register(janitor, select.POLLIN)
            assert poller.poll(60_000), "the janitor did not end"
            os.close(janitor)
            print(f"kill -9: the janitor ended {time.monotonic() - t0:.2f} s after")
            t0 = time.monotonic()
            deadline = time.monotonic() + 10
            while mounts(work) and time.monotonic() < deadline:
                time.sleep(0.01)
            unbound = time.monotonic() - t0
            deadline = time.monotonic() + 10  # the line comes after the detaches
            while "ended (the" not in _after(service, work) and time.monotonic() < deadline:
                time.sleep(0.01)
            said = _after(service, work)
            assert "ended (the launcher exited)" in said or "ended (the connection was lost)" \
                in said, said
            print(f"kill -9: the service unbound in {unbound:.2f} s")
        host.wait(timeout=60)
    finally:
        proc.kill()
        host.kill()
    print(f"{backend}: {count.read_text().strip()} host git status iterations; {err}")
    assert int(count.read_text()) > 0  # the host loop ran
    assert not (canary / "runs").exists(), (canary / "runs").read_text()
    assert mounts(work) == []
    assert "the live gate is off" not in err, err
    if backend == "nono":
        _left_by_a_killed_launcher(work)
    after = "git status --short && git -c user.name=u -c user.email=u@u commit -q -m a"
    done = user_sh(user, after + " --allow-empty", work, env, capture=True)
    _, said = done.communicate(timeout=60)
    assert done.returncode == 0, said
    assert not (canary / "runs").exists()
    if backend == "nono":  # the next start: nothing left to repair, the gate again
        again = _session(user, place, env, backend, "true")
        _, err = again.communicate(timeout=90)
        assert again.returncode == 0 and "left its live guard" not in err, err
        assert mounts(work) == []
        doctor = subprocess.run(user.argv(["agent-sandbox", "doctor",
                                           f"--config={place / 'config.toml'}"]),
                                env=env, cwd=work, capture_output=True, text=True, timeout=60)
        assert "live guard: the fanotify gate through the gate service at" in doctor.stdout, \
            doctor.stdout + doctor.stderr


def _left_by_a_killed_launcher(work: Path) -> None:
    """The host loop's git may have been refused its ``index.lock`` (the "last second" rule,
    after its first opens): the kernel makes an ``O_CREAT`` file before it asks fanotify.
    A launcher that ends removes such a file (hostrun_locks: the bwrap run above proves it);
    one killed with -9 removes nothing (docs/hostrun-gate.md, "Not covered"): that, and only
    that, is taken away here before git runs again."""
    lock = work / ".git" / "index.lock"
    if lock.exists():
        assert lock.stat().st_size == 0, "an index.lock with content: a git left it mid-write"
        print("the host loop's refused create left an empty .git/index.lock (kill -9)")
        lock.unlink()


def _a_stopped_launcher_holds_no_open_without_bound(user: OrdinaryUser, pid: int, work: Path,
                                                    env: dict[str, str]) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while not _stopped(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        reader = user_sh(user, "cat a.txt", work, env, capture=True)
        try:
            _, err = reader.communicate(timeout=PATIENCE + 20)  # not held without bound
        except subprocess.TimeoutExpired:
            reader.kill()
            raise AssertionError("a host open waited on a stopped launcher") from None
        assert reader.returncode != 0 and "Operation not permitted" in err, err
        # A create with O_EXCL, as git takes its index.lock: refused, its file left.  Not
        # index.lock itself: the host loop's git may hold that one for a moment (a live
        # lock, which it removes when a later open is refused: "File exists" here, and
        # nothing left for the launcher to remove; 1 run in 6 saw that).
        lock = user_sh(user, "set -C; : > .git/probe.lock", work, env, capture=True)
        _, err = lock.communicate(timeout=PATIENCE + 20)
        assert lock.returncode != 0 and "Operation not permitted" in err, err
        assert (work / ".git/probe.lock").stat().st_size == 0
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_root_session_prefers_the_service(world: World, service: Service) -> None:
    """Root's launcher could gate alone, but with the service there it asks it: then a
    stopped root launcher does not hold the host's opens without bound either."""
    work = _repo(world)
    env = {**world.env(), "AGENT_SANDBOX_GATE_SOCKET": service.socket}
    proc = world.launch("sh", "-c", "touch planted; while [ ! -e go ]; do sleep 0.05; done",
                        sandbox="bwrap", env=env)
    try:
        _wait(work / "planted")
        assert len(mounts(work)) == 2
        assert f"gating '{work}'" in service.log()
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while not _stopped(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            reader = subprocess.run(["cat", "a.txt"], cwd=work, capture_output=True, text=True,
                                    timeout=PATIENCE + 20)  # not held without bound
            assert reader.returncode != 0 and "Operation not permitted" in reader.stderr
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert (work / "a.txt").read_text() == "a\n"  # answered again
        (work / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert mounts(work) == []
