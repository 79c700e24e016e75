"""Resource limits (issue 19): the pure parts, then every cell against a runaway.

Cells: (brokered command, agent session) x (bwrap, nono = Landlock) x (root,
ordinary user).  As root this host gives cgroups (v1 memory and pids here);
an ordinary user gets rlimits.  Each cell runs ``limits_probe.py`` once
inside, with small limits (64 tasks, 256 MiB, a 16 MiB /tmp): a bounded fork
bomb must be refused, a memory hog killed or refused, /tmp (bwrap) filled
only to its size; the session's servers keep serving, the host can start a
process right after, the report names what was hit, and no cgroup is left.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_user import OrdinaryUser
from battery import BIN, PYTHON, Cell, cannot_run, the_user

from libbroker.broker.profile import parse_profile
from libbroker.errors import ConfigError
from libbroker.launcher.config import HostFacts
from libbroker.launcher.config import from_mapping as config_from_mapping
from libbroker.sandbox import bwrap, cgroups, limits
from libbroker.sandbox.limits import GiB, Limits, LimitsError, MiB, parse_size, parse_value
from libbroker.sandbox.shape import Shape

PROBE = Path(__file__).with_name("limits_probe.py")
SMALL = {"tasks": 64, "memory": "256M", "tmp": "16M"}

# --- pure ---------------------------------------------------------------------------


def test_sizes() -> None:
    assert parse_size("8G") == 8 * GiB
    assert parse_size("512M") == parse_size("512MiB") == parse_size("512mb") == 512 * MiB
    assert parse_size("1.5G") == 3 * GiB // 2
    assert parse_size("64k") == 64 << 10
    assert parse_size(4096) == parse_size("4096") == 4096
    for bad in ("", "G", "-1G", "0", "8X", "8 G B", True, None, 1.5e-9, "nan"):
        with pytest.raises(LimitsError, match="size"):
            parse_size(bad)
    assert limits.size_text(8 * GiB) == "8 GiB" and limits.size_text(256 * MiB) == "256 MiB"


def test_values_and_defaults() -> None:
    d = Limits()
    assert d.tasks == 4096 and d.tmp == 2 * GiB and d.cpu is None and d.timeout is None
    assert d.memory == limits.default_memory() <= 8 * GiB
    assert parse_value("timeout", "10m") == 600 and parse_value("timeout", 90) == 90
    assert parse_value("cpu", "1.5") == 1.5 and parse_value("memory", "off") is None
    for name, bad in (("tasks", "1.5"), ("tasks", 4), ("cpu", "-1"), ("timeout", "1d")):
        with pytest.raises(LimitsError, match=name):
            parse_value(name, bad)
    got = limits.from_mapping({"tasks": "64", "memory": "off"}, "x")
    assert got.tasks == 64 and got.memory is None and got.tmp == 2 * GiB
    assert limits.from_mapping(got.to_mapping(), "again") == got
    with pytest.raises(LimitsError, match="unknown limit 'mem'"):
        limits.from_mapping({"mem": "1G"}, "x")
    assert limits.parse_flags(["memory=1G", "tasks=9", "memory=2G"]) == {
        "memory": "2G",
        "tasks": "9",
    }
    for bad in ("memory", "memory=", "nproc=9"):
        with pytest.raises(LimitsError):
            limits.parse_flags([bad])


def test_config_and_profile_keys() -> None:
    facts = HostFacts(home="/home/u", cwd="/home/u/p", gh_present=False)
    cfg = config_from_mapping({"limits": {"tasks": 100, "memory": "1G", "cpu": 2}}, facts)
    assert (cfg.limits.tasks, cfg.limits.memory, cfg.limits.cpu) == (100, GiB, 2.0)
    with pytest.raises(ConfigError, match="unknown limit 'procs'"):
        config_from_mapping({"limits": {"procs": 1}}, facts)
    with pytest.raises(ConfigError, match=r"limits\.memory: must be a size"):
        config_from_mapping({"limits": {"memory": "lots"}}, facts)
    profile = parse_profile({"limits": {"memory": "256M", "timeout": 30}})
    assert profile.limits.memory == 256 * MiB and profile.limits.timeout == 30
    assert parse_profile({}).limits == Limits()
    with pytest.raises(ConfigError, match="unknown limit 'pids'"):
        parse_profile({"limits": {"pids": 1}})


def test_bwrap_tmp_gets_its_size() -> None:
    host = bwrap.Facts(frozenset(), frozenset(), {})
    argv = bwrap.argv(Shape(tmp_size=16 * MiB), host)
    i = argv.index("--size")
    assert argv[i : i + 4] == ["--size", str(16 * MiB), "--tmpfs", "/tmp"]
    assert "--size" not in bwrap.argv(Shape(), host)


def _fake_cgroup(root: Path, rel: str, enabled: str) -> None:
    d = root / rel.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.subtree_control").write_text(enabled)
    (d / "cgroup.procs").write_text("")


def test_the_strongest_mechanism_is_found(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    _fake_cgroup(v2, "/", "cpu memory pids")
    _fake_cgroup(v2, "/user.slice/user@1000.service", "memory pids")
    _fake_cgroup(v2, "/user.slice/user@1000.service/app.slice/term.scope", "")
    mounts = f"cgroup2 {v2} cgroup2 rw 0 0\n"
    mech = cgroups.discover(mounts, "0::/user.slice/user@1000.service/app.slice/term.scope\n")
    assert mech.kind == "cgroup2"
    assert mech.bases[0][1] == str(v2 / "user.slice/user@1000.service")
    v1 = tmp_path / "v1"
    for name in ("memory", "pids"):
        _fake_cgroup(v1 / name, "/a", "")
    mounts = "".join(f"cgroup {v1 / n} cgroup rw,{n} 0 0\n" for n in ("memory", "pids"))
    mounts += f"cgroup2 {tmp_path / 'empty'} cgroup2 rw 0 0\n"
    mech = cgroups.discover(mounts, "4:memory:/a\n3:pids:/a\n0::/\n")
    assert mech.kind == "cgroup1" and [n for n, _ in mech.bases] == ["memory", "pids"]
    assert cgroups.discover("", "").kind == "rlimit"


# --- every cell ------------------------------------------------------------------------

CELLS = [
    Cell(who, path, backend)
    for who in ("root", "user")
    for path in ("session", "broker")
    for backend in ("bwrap", "nono")
]


def _groups_left(*, alive: bool = False) -> list[str]:
    """The agent-sandbox cgroups under this process's bases whose maker is gone.

    Those are leftovers; with ``alive`` the live makers' too (other tests'
    servers may run meanwhile, on this machine or beside this test run).
    """
    found = []
    for _, base in cgroups.mechanism().bases:
        for entry in os.listdir(base):
            owner = entry[len(limits.PREFIX) :].split("-", 1)[0]
            if entry.startswith(limits.PREFIX) and (alive or not Path(f"/proc/{owner}").exists()):
                found.append(entry)
    return found


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[tuple[Cell, Path, OrdinaryUser | None]]:
    cell: Cell = request.param
    if why := cannot_run(cell):
        pytest.skip(why)
    user = the_user() if cell.who == "user" else None
    base = Path(tempfile.mkdtemp(prefix="as-lim-", dir="/tmp"))
    (base / "home").mkdir()
    (base / "work").mkdir()
    (base / "rt").mkdir(mode=0o700)
    (base / "work" / "probe.py").write_text(PROBE.read_text())
    if user is not None:
        user.own(base)
    try:
        yield cell, base, user
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _env(base: Path, user: OrdinaryUser | None) -> dict[str, str]:
    path = BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin")
    env = {"PATH": path, "LANG": "C.UTF-8"}
    if user is not None:
        env = user.env(base / "home") | {"PATH": path}
    return env | {"HOME": str(base / "home"), "XDG_RUNTIME_DIR": str(base / "rt")}


def _wrap(user: OrdinaryUser | None, argv: list[str]) -> list[str]:
    return user.argv(argv) if user is not None else argv


def _probe_argv(backend: str, session: bool) -> list[str]:
    extra = (["tmp"] if backend == "bwrap" else []) + (["broker"] if session else [])
    return [PYTHON, "-I", "-S", "probe.py", "200", *extra]


def _result(out: str, err: str) -> dict[str, object]:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"the probe printed nothing:\n{out}\n{err}"
    result: dict[str, object] = json.loads(lines[-1])
    return result


def _session(base: Path, backend: str, user: OrdinaryUser | None) -> tuple[dict[str, object], str]:
    config = base / "config.toml"
    table = ", ".join(f'{k} = "{v}"' for k, v in SMALL.items())
    config.write_text(f'workdir = "{base / "work"}"\ntoken_command = ""\nlimits = {{{table}}}\n')
    if user is not None:
        user.own(config)
    argv = ["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}", "--"]
    done = subprocess.run(
        _wrap(user, [*argv, *_probe_argv(backend, True)]), env=_env(base, user),
        cwd=base / "work", capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    # The session's servers survived the hog: a crash would end it with 1 and say so.
    assert done.returncode == 0, done.stderr
    assert "unexpectedly" not in done.stderr
    return _result(done.stdout, done.stderr), done.stderr


def _brokered(base: Path, backend: str, user: OrdinaryUser | None) -> tuple[dict[str, object], str]:
    sock, profile = base / "rt" / "b.sock", base / "profile.json"
    profile.write_text(json.dumps({"limits": SMALL}))
    if user is not None:
        user.own(profile)
    argv = ["broker-server", f"--socket={sock}", f"--workdir={base / 'work'}"]
    argv += [f"--sandbox={backend}", f"--profile={profile}"]
    server = subprocess.Popen(
        _wrap(user, argv), env=_env(base, user), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=base,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("listening unix:")
        env = _env(base, user) | {"AGENT_SANDBOX_BROKER_SOCKET": str(sock)}

        def client(*cmd: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                _wrap(user, ["broker-client", "-n", "--", *cmd]), env=env, cwd=base / "work",
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        done = client(*_probe_argv(backend, False))
        assert done.returncode == 0, done.stderr
        assert server.poll() is None, "the broker-server died"
        assert client("true").returncode == 0  # and still serves
        return _result(done.stdout, done.stderr), done.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", CELLS, ids=str, indirect=True)
def test_a_runaway_stops_at_its_limits(world: tuple[Cell, Path, OrdinaryUser | None]) -> None:
    cell, base, user = world
    started = time.monotonic()
    run = _session if cell.path == "session" else _brokered
    got, err = run(base, cell.backend, user)
    bomb = got["bomb"]
    assert isinstance(bomb, dict)
    assert bomb["error"] == "EAGAIN", got
    # The refusal (EAGAIN) at or before the 64th child is the limit at work.  Other
    # tasks of the sandbox usually count too (fewer than 64 then), but as an
    # ordinary user under the broker's bwrap a run with exactly 64 was seen (about
    # one in seven): which of bwrap's own tasks are still counted varies.
    assert 0 < bomb["forked"] <= 64, got
    assert got["hog"] in (-9, 3), got  # killed in its cgroup, or refused (MemoryError)
    if cell.backend == "bwrap":
        tmp = got["tmp"]
        assert isinstance(tmp, dict)
        assert tmp["error"] in ("ENOSPC", "EFBIG"), got
        assert tmp["written"] <= 16 * MiB, got
    if cell.path == "session":
        assert got["broker"] == 0, got
    # The host can still start a process, as root and as the user.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert subprocess.run(_wrap(user, ["true"]), env=_env(base, user)).returncode == 0
    if cgroups.mechanism().kind != "rlimit" and user is None:
        who = "session" if cell.path == "session" else "command"
        assert f"the {who} hit its task limit (64)" in err, err
        assert f"the {who} hit its memory limit (256 MiB)" in err, err
        assert not _groups_left()
    assert time.monotonic() - started < 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [Cell("user", "session", "bwrap")], ids=str, indirect=True)
def test_under_rlimits_the_commands_parent_set_them_itself(
    world: tuple[Cell, Path, OrdinaryUser | None],
) -> None:
    """The forwarder (the command's parent) was told the limits and holds them: the
    launcher's prlimit walk at go cannot promise them alone (a fork in flight keeps
    the old ones; a CI run once saw this cell's bomb and hog run unlimited)."""
    _, base, user = world
    assert user is not None
    config = base / "config.toml"
    table = ", ".join(f'{k} = "{v}"' for k, v in SMALL.items())
    config.write_text(f'workdir = "{base / "work"}"\ntoken_command = ""\nlimits = {{{table}}}\n')
    user.own(config)
    show = 'tr "\\0" " " < /proc/$PPID/cmdline; echo; grep "^Max [pd]" /proc/$PPID/limits'
    done = subprocess.run(
        _wrap(user, ["agent-sandbox", "run", "--sandbox=bwrap", f"--config={config}", "--",
                     "sh", "-c", show]),
        env=_env(base, user), cwd=base / "work", capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv, *limits = done.stdout.splitlines()
    assert "forwarder" in argv  # forwarder.py, or the native one (libbroker/native)
    if "--rlimit" not in argv:
        pytest.skip("this user's limits are a delegated cgroup here, not rlimits")
    assert f"--rlimit {resource.RLIMIT_NPROC}=64 " in argv, argv
    assert f"--rlimit {resource.RLIMIT_DATA}={256 * MiB} " in argv, argv
    held = {row[:26].strip(): row[26:].split()[:2] for row in limits}
    assert held["Max processes"] == ["64", "64"], limits
    assert held["Max data size"] == [str(256 * MiB)] * 2, limits


@pytest.mark.timeout(60)
def test_node_runs_under_the_rlimits() -> None:
    """RLIMIT_DATA, not RLIMIT_AS: V8 reserves far more than it uses (wasm: 8 GiB+)."""
    node = subprocess.run(["sh", "-c", "command -v node"], capture_output=True, text=True)
    if node.returncode != 0:
        pytest.skip("node is not installed")
    group = cgroups.create(Limits(memory=GiB), "node", cgroups.Mechanism("rlimit"))
    code = "new WebAssembly.Memory({initial: 10}); console.log(Buffer.alloc(1 << 24).length)"
    done = subprocess.run(
        ["node", "-e", code], capture_output=True, text=True, timeout=30,
        preexec_fn=lambda: cgroups.join_self(group.entry()),
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == str(1 << 24), done.stderr


@pytest.mark.timeout(60)
def test_the_janitor_removes_a_killed_launchers_cgroup(tmp_path: Path) -> None:
    if os.geteuid() != 0 or cgroups.mechanism().kind == "rlimit":
        pytest.skip("needs a cgroup mechanism (root here)")
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "c.toml"
    config.write_text(f'workdir = "{work}"\ntoken_command = ""\nlimits = {{tasks = 64}}\n')
    env = {"PATH": BIN + ":" + os.environ["PATH"], "HOME": str(tmp_path)}
    launcher = subprocess.Popen(
        ["agent-sandbox", "run", "--sandbox=bwrap", f"--config={config}", "--", "sleep", "60"],
        env=env, cwd=work, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    name = f"{limits.PREFIX}{launcher.pid}-session"
    deadline = time.monotonic() + 20
    while name not in _groups_left(alive=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name in _groups_left(alive=True)
    time.sleep(0.5)  # the sandbox moved in
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 20
    while name in _groups_left(alive=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name not in _groups_left(alive=True)


def test_move_tree_puts_a_waiting_tree_in_place() -> None:
    """The bwrap session's way in: top down, before anything of CMD runs."""
    if os.geteuid() != 0 or cgroups.mechanism().kind == "rlimit":
        pytest.skip("needs a cgroup mechanism (root here)")
    group = cgroups.create(Limits(tasks=32), "tree")
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        time.sleep(0.2)
        assert cgroups.move_tree(group, tree.pid) == 3
        for directory in group.dirs:
            assert len((Path(directory) / "cgroup.procs").read_text().split()) == 3
        # Again (the session's pass at go, after its early one): nothing is written, as
        # each write may wait a kernel grace period.
        writes: list[str] = []
        real = cgroups._write
        cgroups._write = lambda *args: writes.append(args[0])  # type: ignore[assignment]
        try:
            assert cgroups.move_tree(group, tree.pid) == 3
        finally:
            cgroups._write = real  # type: ignore[assignment]
        assert writes == []
    finally:
        tree.kill()
        tree.wait()
        cgroups.remove(group)
    assert not any(os.path.exists(d) for d in group.dirs)


def test_the_wait_for_bwraps_mounts_ends_with_bwrap() -> None:
    """The config links' hold waits (in a thread, until go) for the sandbox's first
    process; an outer process that exited first ends that wait at once, not at the
    start timeout."""
    from libbroker.sandbox import holdlink

    gone = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{gone.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    began = time.monotonic()
    try:
        with pytest.raises(OSError, match="exited while starting"):
            holdlink.sandbox_process(gone.pid, 30)
    finally:
        gone.wait()
    assert time.monotonic() - began < 5
    with pytest.raises(OSError, match="exited while starting"):
        holdlink.sandbox_process(gone.pid, 30)  # reaped: no such process


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo") as fh:
        return {line.split()[4] for line in fh}


def test_the_links_hold_never_mounts_in_the_launchers_own_namespace(tmp_path: Path) -> None:
    """The hold joins the mount namespace of the sandbox's first process that runs
    something else than bwrap: a process found there that shares the launcher's own
    namespace (a bwrap that is not one, a wrapper's child) is refused, never mounted
    on: the host's link would become a mount point."""
    from libbroker.sandbox import holdlink

    if os.geteuid() != 0:
        pytest.skip("mounting in the launcher's own namespace needs root to be tried at all")
    (tmp_path / "target").write_text("")
    link = tmp_path / "config"
    link.symlink_to(tmp_path / "target")
    fake = subprocess.Popen(["sh", "-c", "sleep 30; true"])  # not bwrap: no namespaces
    try:
        time.sleep(0.1)
        with pytest.raises(OSError, match="could not be made mount points"):
            holdlink.hold_in(fake.pid, (str(link),), 5)
    finally:
        fake.kill()
        fake.wait()
    assert str(link) not in _mount_points()
    # A sandbox that exited first: nothing held, nothing said (its start fails anyway).
    holdlink.hold_in(fake.pid, (str(link),), 5)
